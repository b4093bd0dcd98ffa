"""``kgsynth eval``: evaluate a checkpoint (or an API model) as a KG agent on benchmark
questions, or compare earlier evaluations (see :mod:`kgsynth.eval`).

Parses options, loads the questions, the KG and the model, calls the core, writes
``predictions.parquet``, ``metrics.json``, ``eval.png`` and ``manifest.json``; no logic lives
here::

    kgsynth eval --questions kgsynth/resources/metaqa/dev_sample/metaqa_dev_sample.jsonl \\
        --kg runs/kg --model runs/x/stage1 --out runs/x/eval/stage1 --runs 3 --temperature 1.0
    kgsynth eval --compare runs/x/eval/stage1 runs/x/eval/stage2 runs/x/eval/rl --out runs/x/summary
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kgsynth.cli.common import (
    fail,
    open_graph_option,
    progress_bar,
    stderr,
    stdout,
)
from kgsynth.cli.eval_tables import print_compare, print_paired, print_results
from kgsynth.cli.fields import config_command
from kgsynth.cli.options import (
    ApiKeyOption,
    BaseUrlOption,
    ConcurrencyOption,
    ConfigOption,
    DeviceOption,
    KGOption,
    MaxRetriesOption,
    OverwriteOption,
    ProfileOption,
    TimeoutOption,
)
from kgsynth.cli.panels import EVALUATION, INPUTS, LAUNCH, MODEL, OUTPUT
from kgsynth.core.errors import ConfigError, KGSynthError
from kgsynth.eval.checkpoints import eval_carries
from kgsynth.eval.config import EvalConfig

DirsArgument = Annotated[
    list[Path] | None,
    typer.Argument(
        help="With --compare: evaluation folders (DIR/metrics.json or DIR/eval/metrics.json).",
        show_default=False,
    ),
]
CompareOption = Annotated[
    bool,
    typer.Option(
        "--compare",
        help="Compare earlier evaluations (the DIR arguments): print one table, write "
        "compare.md and compare.png to --out.",
        rich_help_panel=INPUTS,
    ),
]
QuestionsOption = Annotated[
    Path | None,
    typer.Option(
        help="Question file: MetaQA txt (question<TAB>a1|a2, topic in [...]), JSONL or "
        "Parquet with question, topic_names, answer_names (optional qtype, hops, structure), "
        "or a WebQSP, CWQ, GrailQA or GraphQuestions .json as published (answers also "
        "matched by id and alias).",
        rich_help_panel=INPUTS,
    ),
]
QtypeFileOption = Annotated[
    Path | None,
    typer.Option(
        help="MetaQA question-type file (default: qa_<split>_qtype.txt found beside the file).",
        rich_help_panel=INPUTS,
        hidden=True,
    ),
]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Output folder: predictions.parquet, metrics.json, eval.png, manifest.json "
        "(with --compare: compare.md, compare.png).",
        rich_help_panel=OUTPUT,
    ),
]
PolicyOption = Annotated[
    str,
    typer.Option(
        "--llm", help="Policy backend: hf (a local checkpoint) or openai.", rich_help_panel=MODEL
    ),
]
PolicyModelOption = Annotated[
    str | None,
    typer.Option(
        help="Checkpoint folder (hf, e.g. runs/x/stage1) or model name (openai).",
        rich_help_panel=MODEL,
    ),
]
BatchSizeOption = Annotated[
    int | None,
    typer.Option(
        help="Sequences per generate() call (hf). \\[default: 8]",
        rich_help_panel=MODEL,
        hidden=True,
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        help="hf on CPU: generate in N processes (the same answers as one, sooner on N "
        "free cores). \\[default: 1]",
        rich_help_panel=LAUNCH,
        hidden=True,
    ),
]
EvalCacheOption = Annotated[
    Path | None,
    typer.Option(
        help="Request cache (SQLite); off by default, so every run samples afresh "
        "(runs use seeds seed, seed+1, …, so N runs stay N samples with a cache too). A "
        "checkpoint (hf) is known there by its files, not its path: a folder holding the same "
        "model (a stage that kept its start's weights) answers from it, retrained weights do not.",
        rich_help_panel=MODEL,
        hidden=True,
    ),
]
LabelOption = Annotated[
    str | None,
    typer.Option(
        help="Name in tables and plots. \\[default: the training stage or folder]",
        rich_help_panel=OUTPUT,
        hidden=True,
    ),
]


@config_command(EvalConfig, section="eval", carried=eval_carries, panel=EVALUATION)
def eval_cmd(
    cfg: EvalConfig,
    dirs: DirsArgument = None,
    compare: CompareOption = False,
    questions: QuestionsOption = None,
    qtype_file: QtypeFileOption = None,
    out_dir: OutOption = None,
    kg: KGOption = None,
    profile: ProfileOption = None,
    llm: PolicyOption = "hf",
    model: PolicyModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    concurrency: ConcurrencyOption = 16,
    timeout: TimeoutOption = 120.0,
    max_retries: MaxRetriesOption = 5,
    batch_size: BatchSizeOption = None,
    device: DeviceOption = None,
    workers: WorkersOption = None,
    cache: EvalCacheOption = None,
    label: LabelOption = None,
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
        llm_options = dict(
            base_url=base_url,
            api_key=api_key,
            concurrency=concurrency,
            timeout=timeout,
            max_retries=max_retries,
            batch_size=batch_size,
            device=device,
            workers=workers,
        )
        if llm == "hf":  # a LoRA checkpoint's base, where it is not where the adapter says
            llm_options["base_model"] = cfg.base_model
        keep = (
            ("batch_size", "device", "workers", "base_model") if llm == "hf" else tuple(llm_options)
        )
        _evaluate(
            cfg,
            questions=questions,
            qtype_file=qtype_file,
            out_dir=out_dir,
            kg=kg,
            profile=profile,
            llm=llm,
            model=model,
            llm_options={k: v for k, v in llm_options.items() if k in keep and v is not None},
            cache=cache,
            label=label,
            config=config,
            overwrite=overwrite,
        )
    except KGSynthError as exc:
        fail(exc)


def _evaluate(
    cfg: EvalConfig,
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
    label: str | None,
    config: Path | None,
    overwrite: bool,
) -> None:
    from kgsynth.eval.checkpoints import checkpoint_label
    from kgsynth.eval.config import load_questions
    from kgsynth.eval.outputs import eval_output, write_eval
    from kgsynth.eval.subjects import check_answered, plan_subjects, run
    from kgsynth.llm import make_llm

    started = time.perf_counter()
    if questions is None:
        raise ConfigError(
            "--questions is required (a MetaQA txt, JSONL, Parquet or benchmark .json file)"
        )
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
    cfg = cfg.for_policy(llm, model)
    if cfg.greedy_repeats:
        stderr.print(
            f"[yellow]warning:[/yellow] --runs {cfg.runs} at --temperature 0: greedy runs of a "
            "local model are identical; sample with --temperature > 0",
            highlight=False,
        )
    records = load_questions(questions, qtype_file=qtype_file, limit=cfg.limit)
    subjects = plan_subjects(model, llm, cfg)
    staged = eval_output(
        out_dir,
        overwrite=overwrite,
        backend=llm,
        subjects=subjects,
        questions=questions,
        qtype_file=qtype_file,
        kg=kg,
        cache=cache,
        config=config,
    )
    with staged:
        graph = open_graph_option(kg, profile)
        label = label or checkpoint_label(model)
        clients: dict[str, Any] = {}
        for subject in subjects:
            if subject.model not in clients:
                clients[subject.model] = make_llm(
                    llm, cache=cache, model=subject.model, **llm_options
                )
        with progress_bar() as bar:
            task = bar.add_task(label, total=len(records) * cfg.runs * len(subjects), info="")

            def progress(done: int, total: int, info: str) -> None:
                requests = sum(c.stats.requests for c in clients.values())
                errors = sum(c.stats.errors for c in clients.values())
                bar.update(
                    task, completed=done, info=f"{info}; requests {requests}, errors {errors}"
                )

            result = run(
                records,
                cfg,
                graph=graph,
                llm={s.name: clients[s.model] for s in subjects},
                progress=progress,
            )
        for client in clients.values():
            client.close()
        metrics = write_eval(
            staged,
            result,
            cfg,
            label=label,
            questions=questions,
            backend=llm,
            subjects=subjects,
            clients=clients,
            started=started,
        )
    check_answered(result.accepted, subjects, clients, out_dir)
    print_results(metrics)
    stdout.print(f"→ {out_dir} (predictions.parquet, metrics.json, eval.png, manifest.json)")


def _compare(dirs: list[Path], out_dir: Path | None, overwrite: bool = False) -> None:
    from kgsynth.eval.compare import run_compare
    from kgsynth.eval.outputs import compare_output, write_compare

    result = run_compare(dirs)
    print_compare(result.accepted)
    print_paired(result.stats["paired"])
    if out_dir is not None:
        with compare_output(out_dir, dirs, overwrite=overwrite) as staged:
            write_compare(staged, result, dirs)
        stdout.print(
            f"→ {out_dir / 'compare.md'}, {out_dir / 'compare.png'}, {out_dir / 'compare.json'}, "
            f"{out_dir / 'paired.json'}"
        )


__all__ = ["eval_cmd"]
