"""``kgsynth eval``: evaluate a checkpoint (or an API model) as a KG agent on benchmark
questions, or compare earlier evaluations (see :mod:`kgsynth.eval`).

Parses options, loads the questions, the KG and the model, calls the core, writes
``predictions.parquet``, ``metrics.json``, ``eval.png`` and ``manifest.json``; no logic lives
here::

    kgsynth eval --questions data/metaqa/dev_sample/metaqa_dev_sample.jsonl --kg runs/kg \\
        --model runs/x/stage1 --out runs/x/eval/stage1 --runs 3 --temperature 1.0
    kgsynth eval --compare runs/x/eval/stage1 runs/x/eval/stage2 runs/x/eval/rl --out runs/x/summary
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kgsynth.cli.common import err, fail, open_graph_option, out, progress_bar
from kgsynth.cli.options import (
    ApiKeyOption,
    BaseUrlOption,
    ConcurrencyOption,
    ConfigOption,
    DeviceOption,
    KGOption,
    MaxRetriesOption,
    MaxTurnsOption,
    OverwriteOption,
    ProfileOption,
    RelationRankingOption,
    ReportToOption,
    RerankOption,
    TimeoutOption,
    ToolsOption,
    TurnTokensOption,
)
from kgsynth.errors import ConfigError, InputFileError, KGSynthError
from kgsynth.modelio import is_model_folder


def eval_cmd(
    dirs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="With --compare: evaluation folders (DIR/metrics.json or DIR/eval/metrics.json).",
            show_default=False,
        ),
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Compare earlier evaluations (the DIR arguments): print one table, write "
            "compare.md and compare.png to --out.",
        ),
    ] = False,
    questions: Annotated[
        Path | None,
        typer.Option(
            help="Question file: MetaQA txt (question<TAB>a1|a2, topic in [...]), JSONL or "
            "Parquet with question, topic_names, answer_names (optional qtype, hops, structure)."
        ),
    ] = None,
    qtype_file: Annotated[
        Path | None,
        typer.Option(
            help="MetaQA question-type file (default: qa_<split>_qtype.txt found beside the file)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Output folder: predictions.parquet, metrics.json, eval.png, manifest.json "
            "(with --compare: compare.md, compare.png).",
        ),
    ] = None,
    kg: KGOption = None,
    profile: ProfileOption = None,
    llm: Annotated[
        str, typer.Option("--llm", help="Policy backend: hf (a local checkpoint) or openai.")
    ] = "hf",
    model: Annotated[
        str | None,
        typer.Option(help="Checkpoint folder (hf, e.g. runs/x/stage1) or model name (openai)."),
    ] = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    concurrency: ConcurrencyOption = 16,
    timeout: TimeoutOption = 120.0,
    max_retries: MaxRetriesOption = 5,
    batch_size: Annotated[
        int | None, typer.Option(help="Sequences per generate() call (hf). \\[default: 8]")
    ] = None,
    device: DeviceOption = None,
    cache: Annotated[
        Path | None,
        typer.Option(
            help="Request cache (SQLite); off by default, so every run samples afresh "
            "(runs use seeds seed, seed+1, …, so N runs stay N samples with a cache too)."
        ),
    ] = None,
    runs: Annotated[
        int | None, typer.Option(help="Runs per question (run r uses seed + r). \\[default: 1]")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature. \\[default: 0 (greedy)]")
    ] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling. \\[default: 1]")] = None,
    max_turns: MaxTurnsOption = None,
    max_tokens: TurnTokensOption = None,
    tools: ToolsOption = None,
    top_k_relations: Annotated[
        int | None, typer.Option(help="Relations shown by get_relations. \\[default: 10]")
    ] = None,
    max_triples: Annotated[
        int | None, typer.Option(help="Triples shown per relation. \\[default: 5]")
    ] = None,
    rerank: RerankOption = None,
    relation_ranking: RelationRankingOption = None,
    report_to: ReportToOption = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed of run 0. \\[default: 0]")] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first K questions.")] = None,
    baseline: Annotated[
        list[str] | None,
        typer.Option(
            help="Also evaluate a baseline, scored the same way (repeatable): untrained (the "
            "model the checkpoint was trained from, as the agent) or no-tools (this model "
            "answering without tools)."
        ),
    ] = None,
    baseline_model: Annotated[
        str | None,
        typer.Option(
            help="The untrained baseline's checkpoint folder (hf) or model name (openai); "
            "default: followed from the checkpoint's manifest.json start_from."
        ),
    ] = None,
    label: Annotated[
        str | None,
        typer.Option(help="Name in tables and plots. \\[default: the training stage or folder]"),
    ] = None,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Evaluate a checkpoint or API model as a KG agent on benchmark questions (EM, F1,
    Hits@1; N runs as mean, majority, first run, KG-R1 union and pass@k; by hops/type/
    structure; optional baselines), or compare earlier evaluations with --compare."""

    try:
        if compare:
            _compare(dirs or [], out_dir, overwrite)
            return
        if dirs:
            raise ConfigError(
                f"unexpected argument(s) {' '.join(map(str, dirs))}; folders are only "
                "given with --compare"
            )
        _evaluate(
            questions=questions,
            qtype_file=qtype_file,
            out_dir=out_dir,
            kg=kg,
            profile=profile,
            llm=llm,
            model=model,
            llm_options=dict(
                base_url=base_url,
                api_key=api_key,
                concurrency=concurrency,
                timeout=timeout,
                max_retries=max_retries,
                batch_size=batch_size,
                device=device,
            ),
            cache=cache,
            overrides=dict(
                runs=runs,
                temperature=temperature,
                top_p=top_p,
                max_turns=max_turns,
                max_tokens=max_tokens,
                toolset=tools,
                top_k_relations=top_k_relations,
                max_triples=max_triples,
                rerank=rerank,
                relation_ranking=relation_ranking,
                report_to=report_to,
                seed=seed,
            ),
            limit=limit,
            baselines=baseline or [],
            baseline_model=baseline_model,
            label=label,
            config=config,
            overwrite=overwrite,
        )
    except KGSynthError as exc:
        fail(exc)


def _llm_options(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    keep = ("batch_size", "device") if backend == "hf" else tuple(options)
    return {k: v for k, v in options.items() if k in keep and v is not None}


def _evaluate(
    *,
    questions: Path | None,
    qtype_file: Path | None,
    out_dir: Path | None,
    kg: str | None,
    profile: str | None,
    llm: str,
    model: str | None,
    llm_options: dict[str, Any],
    cache: Path | None,
    overrides: dict[str, Any],
    limit: int | None,
    baselines: list[str],
    baseline_model: str | None,
    label: str | None,
    config: Path | None,
    overwrite: bool,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.config import build_config
    from kgsynth.eval import (
        BASELINES,
        PREDICTION_SCHEMA,
        EvalConfig,
        check_records,
        checkpoint_label,
        eval_png,
        evaluate,
        untrained_model,
    )
    from kgsynth.llm import make_llm
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.qafiles import read_questions
    from kgsynth.stage_io import StagedOutput

    started = time.perf_counter()
    if questions is None:
        raise ConfigError("--questions is required (a MetaQA txt, JSONL or Parquet file)")
    if out_dir is None:
        raise ConfigError("--out is required (the folder for predictions and metrics)")
    if not model:
        raise ConfigError(
            "--model is required: a checkpoint folder (--llm hf) or a model name (--llm openai)"
        )
    if llm not in ("hf", "openai"):
        raise ConfigError(
            f"--llm must be hf or openai (got {llm!r}); the template backend cannot act as an agent"
        )
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ConfigError(
            f"--baseline: unknown {', '.join(unknown)}; choose from {', '.join(BASELINES)}"
        )
    if baseline_model and "untrained" not in baselines:
        raise ConfigError("--baseline-model goes with --baseline untrained")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {limit})")
    cfg = build_config(EvalConfig, config, overrides, section="eval")
    if llm == "hf" and cfg.system_text is None:
        from kgsynth.agent.loop import stored_system_prompt

        # the checkpoint is prompted the way it was trained (and its untrained start alike)
        cfg = dataclasses.replace(cfg, system_text=stored_system_prompt(model))
    if cfg.runs > 1 and cfg.temperature == 0:
        err.print(
            f"[yellow]warning:[/yellow] --runs {cfg.runs} at --temperature 0: greedy runs of a "
            "local model are identical; sample with --temperature > 0",
            highlight=False,
        )
    records = read_questions(questions, qtype_file=qtype_file, limit=limit)
    check_records(records, questions)
    if llm == "hf" and not is_model_folder(model):
        raise ConfigError(
            f"--model: {model} is not a transformers checkpoint folder (no config.json)"
        )
    untrained: str | None = None
    if "untrained" in baselines:
        if baseline_model:
            untrained = baseline_model
        elif llm == "openai":
            raise ConfigError(
                "--baseline untrained with --llm openai needs --baseline-model NAME "
                "(the base model's name on the same server)"
            )
        else:
            untrained = str(untrained_model(model))
    options = _llm_options(llm, llm_options)
    if (out_dir / "config.json").is_file() or (
        llm == "hf" and out_dir.resolve() == Path(model).resolve()
    ):
        # its manifest.json and files would replace the checkpoint's own
        raise ConfigError(f"--out: {out_dir} is a model checkpoint; choose another folder")
    staged = StagedOutput(
        out_dir,
        folder=True,
        overwrite=overwrite,
        names={
            "predictions.parquet",
            "metrics.json",
            "eval.png",
            "manifest.json",
            "tensorboard",
            "wandb",
        },
        inputs=[
            ("--questions", questions),
            ("--qtype-file", qtype_file),
            ("--kg", kg),
            ("--model", model if llm == "hf" else None),
            ("--baseline-model", untrained if llm == "hf" else None),
            ("--cache", cache),
            ("--config", config),
        ],
    )
    with staged:
        graph = open_graph_option(kg, profile)
        label = label or checkpoint_label(model)

        # what to run: (system name, model, tools?)
        plan: list[tuple[str, str, bool]] = [("model", model, True)]
        if untrained:
            plan.append(("untrained", untrained, True))
        if "no-tools" in baselines:
            plan.append(("no-tools", model, False))
        clients: dict[str, Any] = {}
        all_rows: list[dict[str, Any]] = []
        results: dict[str, dict[str, Any]] = {}
        with progress_bar() as bar:
            for system, name, with_tools in plan:
                if name not in clients:
                    clients[name] = make_llm(llm, cache=cache, model=name, **options)
                client = clients[name]
                task = bar.add_task(
                    label if system == "model" else system, total=len(records) * cfg.runs, info=""
                )

                def progress(
                    done: int, total: int, info: str, task: Any = task, client: Any = client
                ) -> None:
                    st = client.stats
                    bar.update(
                        task,
                        completed=done,
                        info=f"{info}; requests {st.requests}, errors {st.errors}",
                    )

                rows, metrics = evaluate(
                    records,
                    client,
                    graph if with_tools else None,
                    cfg,
                    system=system,
                    tools=with_tools,
                    progress=progress,
                )
                all_rows.extend(rows)
                results[system] = metrics
        for client in clients.values():
            client.close()

        main = results.pop("model")
        metrics = {
            "label": label,
            "questions_file": str(questions),
            "config": dataclasses.asdict(cfg),
            "kg": graph.kg.describe(),
            **main,
            "baselines": results,
        }
        if cfg.runs > 1 and cfg.temperature == 0:
            metrics["note"] = "several runs at temperature 0: greedy runs of a local model agree"
        paths = {
            "predictions": out_dir / "predictions.parquet",
            "metrics": out_dir / "metrics.json",
            "png": out_dir / "eval.png",
        }
        pq.write_table(
            pa.Table.from_pylist(all_rows, schema=PREDICTION_SCHEMA),
            staged.path("predictions.parquet"),
        )
        staged.path("metrics.json").write_text(
            json.dumps(metrics, indent=2, ensure_ascii=False, default=str) + "\n"
        )
        eval_png(metrics, staged.path("eval.png"))
        if cfg.report_to != "none":
            from kgsynth.tracking import Tracker, scalars

            tracker = Tracker(cfg.report_to, staged.staging, name=f"eval-{label or 'model'}")
            values = scalars(metrics["overall"], "eval/")
            for hops, cell in (metrics.get("breakdowns", {}).get("hops") or {}).items():
                values.update(scalars(cell, f"eval/{hops}-hop/"))
            tracker.log(0, values)
            tracker.close()
        write_manifest(
            staged.path("manifest.json"),
            stage="eval",
            label=label,
            config=dataclasses.asdict(cfg),
            input={
                "questions": str(questions),
                "sha256": sha256_file(questions),
                "rows": len(records),
                "limit": limit,
            },
            model={"backend": llm, "model": model},
            baselines={s: {"model": m, "tools": t} for s, m, t in plan if s != "model"},
            kg=graph.kg.describe(),
            llm={name: c.describe() for name, c in clients.items()},
            output={
                **{k: str(v) for k, v in paths.items()},
                "prediction_rows": len(all_rows),
            },
            elapsed_s=round(time.perf_counter() - started, 3),
        )
        staged.commit()
    _print_results(out, metrics)
    out.print(f"→ {out_dir} (predictions.parquet, metrics.json, eval.png, manifest.json)")


def _print_results(out: Any, metrics: dict[str, Any]) -> None:
    from rich.table import Column, Table

    from kgsynth.eval import METRIC_NAMES, SHOWN_METRICS

    runs = metrics["counts"]["runs"]
    systems = {metrics["label"]: metrics, **metrics["baselines"]}
    columns: list[Any] = [Column("system", no_wrap=True), *(METRIC_NAMES[k] for k in SHOWN_METRICS)]
    if runs > 1:
        columns += ["majority Hits@1", "first-run Hits@1", "KG-R1 union Hits@1", f"pass@{runs}"]
    table = Table(
        *columns,
        title=f"{metrics['label']}: {metrics['counts']['questions']} questions × {runs} run(s)"
        + (" (means over runs)" if runs > 1 else ""),
    )
    process = Table(
        "system", "turns/q", "tool err/q", "format err/q", "tokens/q", "q/s", title="process"
    )
    for name, m in systems.items():
        cells = [name, *(f"{m['overall'][k]:.3f}" for k in SHOWN_METRICS)]
        if runs > 1:
            cells += [
                f"{m['majority']['hits_at_1']:.3f}",
                f"{m['first_run']['hits_at_1']:.3f}",
                f"{m['union']['hits_at_1']:.3f}",
                f"{m['pass_at_k'].get(str(runs), 0.0):.3f}",
            ]
        table.add_row(*cells)
        p = m["process"]
        process.add_row(
            name,
            f"{p['turns_per_question']:.2f}",
            f"{p['tool_errors_per_question']:.2f}",
            f"{p['format_errors_per_question']:.2f}",
            f"{p['generated_tokens_per_question']:.0f}",
            f"{m['speed']['questions_per_s'] or 0:.2f}",
        )
    out.print(table)
    out.print(process)
    for col, groups in metrics["breakdowns"].items():
        if col != "hops" and len(groups) > 12:
            continue  # long type lists are in metrics.json and eval.png
        by = Table(
            col,
            "questions",
            *(METRIC_NAMES[k] for k in SHOWN_METRICS),
            title=f"{metrics['label']} by {col}",
        )
        for key, v in groups.items():
            by.add_row(key, str(v["questions"]), *(f"{v[k]:.3f}" for k in SHOWN_METRICS))
        out.print(by)


def _compare(dirs: list[Path], out_dir: Path | None, overwrite: bool = False) -> None:
    from rich.table import Column, Table

    from kgsynth.eval import (
        METRIC_NAMES,
        SHOWN_METRICS,
        UNION_LABEL,
        compare_markdown,
        compare_png,
        compare_runs,
        fmt_value,
        hop_columns,
    )

    if not dirs:
        raise ConfigError("--compare needs evaluation folders: kgsynth eval --compare DIR DIR …")
    for d in dirs:
        if not d.exists():
            raise InputFileError(d, "no such folder")
    rows = compare_runs(dirs)
    hops = hop_columns(rows)
    with_union = any(r["union_hits_at_1"] is not None for r in rows)
    table = Table(
        Column("run", no_wrap=True),
        "questions",
        "runs",
        *(METRIC_NAMES[k] for k in SHOWN_METRICS),
        *(["union Hits@1"] if with_union else []),
        title="evaluations compared (means over runs)",
        caption=f"union Hits@1: {UNION_LABEL}" if with_union else None,
    )
    by_hop = Table(
        Column("run", no_wrap=True),
        *[f"{h}-hop" for h in hops],
        title="by hops: " + "/".join(METRIC_NAMES[k] for k in SHOWN_METRICS),
    )

    for r in rows:
        cells = [r["label"], str(r["questions"]), str(r["runs"])]
        cells += [fmt_value(r[k]) for k in SHOWN_METRICS]
        if with_union:
            cells.append(fmt_value(r["union_hits_at_1"]))
        table.add_row(*cells)
        by_hop.add_row(
            r["label"],
            *(
                "/".join(fmt_value(r["by_hops"][h][k], 2) for k in SHOWN_METRICS)
                if h in r["by_hops"]
                else "–"
                for h in hops
            ),
        )
    out.print(table)
    if hops:
        out.print(by_hop)
    if out_dir is not None:
        from kgsynth.manifest import write_manifest
        from kgsynth.stage_io import StagedOutput

        md = out_dir / "compare.md"
        sources = "\n".join(f"- {r['label']}: `{r['source']}`" for r in rows)
        staged = StagedOutput(
            out_dir,
            folder=True,
            overwrite=overwrite,
            inputs=[("--compare", d) for d in dirs],
            names={"compare.md", "compare.png", "compare.json", "manifest.json"},
        )
        with staged:
            staged.path("compare.md").write_text(
                "# Evaluations compared\n\nMeans over runs; cells by hop read EM / F1 / Hits@1.\n\n"
                + compare_markdown(rows)
                + f"\n![compare](compare.png)\n\nSources:\n\n{sources}\n"
            )
            compare_png(rows, staged.path("compare.png"))
            staged.path("compare.json").write_text(json.dumps(rows, indent=2) + "\n")
            write_manifest(
                staged.path("manifest.json"),
                stage="eval compare",
                input={"folders": [str(d) for d in dirs]},
                output={"markdown": str(md), "rows": len(rows)},
            )
            staged.commit()
        out.print(f"→ {md}, {out_dir / 'compare.png'}, {out_dir / 'compare.json'}")


__all__ = ["eval_cmd"]
