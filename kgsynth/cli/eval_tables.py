"""The tables ``kgsynth eval`` prints: one evaluation (per system, process, breakdowns) and
several compared (``--compare``)."""

from __future__ import annotations

from typing import Any

from kgsynth.cli.common import stdout


def print_results(metrics: dict[str, Any]) -> None:
    """An evaluation's metrics per system, its process counts, and its breakdowns."""
    from rich.table import Column, Table

    from kgsynth.eval.config import METRIC_NAMES, SHOWN_METRICS

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
    stdout.print(table)
    stdout.print(process)
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
        stdout.print(by)


def print_compare(rows: list[dict[str, Any]]) -> None:
    """Evaluations side by side, overall and by hops."""
    from rich.table import Column, Table

    from kgsynth.eval.compare import fmt_value, hop_columns
    from kgsynth.eval.config import METRIC_NAMES, SHOWN_METRICS, UNION_LABEL

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
    stdout.print(table)
    if hops:
        stdout.print(by_hop)


def print_paired(paired: list[dict[str, Any]]) -> None:
    """Each evaluation against the one before it, and each baseline against its model, on the
    same questions (:mod:`kgsynth.eval.paired`)."""
    from rich.table import Column, Table

    from kgsynth.eval.paired import difference_cell, p_cell

    if not paired:
        return
    table = Table(
        Column("later − earlier", no_wrap=True),
        "questions",
        "Hits@1 difference [95 % CI]",
        "better",
        "worse",
        "sign test p",
        title="stage against stage (paired, same questions)",
        caption="an interval that holds 0 does not tell the two apart",
    )
    for e in paired:
        name = f"{e['later']} − {e['earlier']}"
        if "skipped" in e:
            table.add_row(name, "–", f"skipped: {e['skipped']}", "–", "–", "–")
            continue
        table.add_row(
            name,
            str(e["questions"]),
            difference_cell(e),
            str(e["better"]),
            str(e["worse"]),
            p_cell(e["sign_test_p"]),
        )
    stdout.print(table)
