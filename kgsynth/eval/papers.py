"""The five paper recipes side by side (``make papers``): run folders -> one markdown table.

Each folder is a finished ``kgsynth run NAME --out RUN`` of a paper recipe (graphwalker,
kg-r1, kbqa-r1, knowcoder-a1, isp); its final agent's evaluation (``eval/rl/metrics.json``)
gives Hits@1, F1, strict EM and Hit with their 95 % intervals, and the stages' manifests give
the tokens trained into that agent (the SFT stages it came through: every token of their
batches, copy warm-up included; RL: the tokens the policy generated) and the wall time (every
stage's own elapsed seconds, summed)::

    python -m kgsynth.eval.papers runs/papers/graphwalker runs/papers/kg-r1 ...

A folder's name is its recipe's name; ``LABEL=DIR`` names it otherwise.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.core.errors import InputFileError, KGSynthError
from kgsynth.eval.compare import load_metrics

FINAL_EVAL = Path("eval") / "rl"
"""Where a paper recipe writes its final agent's evaluation."""

METRICS = (("hits_at_1", "Hits@1"), ("f1", "F1"), ("em_strict", "EM (strict)"), ("hit", "Hit"))
"""The table's metric columns: kgsynth's names and the headers."""

HEADLINE = {
    "graphwalker": "EM = Hit, F1",
    "kg-r1": "F1, Hits@1",
    "kg-r1-sft": "F1, Hits@1 (KG-R1's)",
    "kbqa-r1": "EM (strict), F1",
    "knowcoder-a1": "EM = Hit, F1",
    "isp": "Hit, F1",
}
"""What each paper reports, in this table's columns (``kgsynth.metrics`` says which paper's
EM is which): GraphWalker's and KnowCoder-A1's "EM" is Hit (some predicted answer is gold),
KBQA-R1's EM is the strict set match, KG-R1 reports F1 and Hits@1, ISP-KGR Hit and F1."""


@dataclass(frozen=True)
class PaperRow:
    """One recipe's line: its final evaluation and what its training cost."""

    label: str
    questions: int
    metrics: dict[str, float]
    ci95: dict[str, tuple[float, float]]
    sft_tokens: int
    rl_tokens: int
    wall_s: float


def _manifests(run: Path) -> dict[Path, dict[str, Any]]:
    """Every stage manifest of the run by its path (checkpoints' left out)."""
    found = {}
    for path in sorted(run.rglob("*manifest.json")):
        if "checkpoints" in path.relative_to(run).parts:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputFileError(path, f"not a readable manifest: {exc}") from None
        if isinstance(data, dict) and data.get("stage"):
            found[path] = data
    return found


def _final_chain(stages: dict[Path, dict[str, Any]]) -> list[dict[str, Any]]:
    """The training stages the final agent came through: ``rl/``, then each folder its
    manifest's ``start_from`` names (found in this run by its name, wherever the run was made),
    back to a folder no stage of the run wrote (the untrained model). KG-R1's chain is ``rl``
    alone: its base model's one SFT step builds the tokenizer and is not trained on."""
    trained = {p.parent.name: m for p, m in stages.items() if m["stage"].startswith("train ")}
    chain, name = [], "rl"
    while name in trained and len(chain) < len(trained):
        manifest = trained[name]
        chain.append(manifest)
        start = (manifest.get("start_from") or {}).get("path")
        name = Path(start).name if start else ""
    return chain


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def read_run(run: str | Path, label: str | None = None) -> PaperRow:
    """A paper recipe's run folder as one table row; a folder without its final evaluation
    is an :class:`InputFileError` naming the file it looked for."""
    run = Path(run)
    metrics_file = run / FINAL_EVAL / "metrics.json"
    if not metrics_file.is_file():
        raise InputFileError(
            metrics_file, f"no final evaluation; run `kgsynth run RECIPE --out {run}` to the end"
        )
    data = load_metrics(metrics_file)
    overall, ci = data["overall"], data.get("ci95") or {}
    stages = _manifests(run)
    chain = _final_chain(stages)
    sft = sum(_count(m.get("tokens_trained")) for m in chain if m["stage"] != "train rl")
    rl = sum(_count(m.get("generated_tokens")) for m in chain if m["stage"] == "train rl")
    wall = sum(float(m.get("elapsed_s") or 0.0) for m in stages.values())
    return PaperRow(
        label=label or run.name,
        questions=int(data["counts"]["questions"]),
        metrics={k: float(overall[k]) for k, _ in METRICS if overall.get(k) is not None},
        ci95={k: (float(ci[k][0]), float(ci[k][1])) for k, _ in METRICS if k in ci},
        sft_tokens=sft,
        rl_tokens=rl,
        wall_s=wall,
    )


def _cell(row: PaperRow, key: str) -> str:
    if key not in row.metrics:
        return "–"
    value = f"{row.metrics[key]:.3f}"
    if key in row.ci95:
        low, high = row.ci95[key]
        value += f" [{low:.3f}, {high:.3f}]"
    return value


def papers_table(rows: list[PaperRow]) -> str:
    """The rows as one markdown table, with a line saying what the columns mean."""
    head = ["recipe", "questions", *(name for _, name in METRICS), "the paper reports"]
    head += ["SFT tokens", "RL tokens", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.label, str(row.questions), *(_cell(row, k) for k, _ in METRICS)]
        cells += [HEADLINE.get(row.label, "–"), f"{row.sft_tokens:,}", f"{row.rl_tokens:,}"]
        cells.append(f"{row.wall_s:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    counts = sorted({row.questions for row in rows})
    if len(counts) > 1:  # a --limit differed: the rows are not on the same questions
        lines += [
            "",
            f"warning: the runs were evaluated on different numbers of questions {counts}",
        ]
    lines += [
        "",
        "Each recipe's final agent (eval/rl) on the same dev questions, greedy; 95 % intervals "
        "in brackets. EM (strict): predicted set = gold set; Hit: some predicted answer is gold; "
        "Hits@1: the first answer is gold. SFT tokens: every token of the SFT batches the final "
        "agent came through (copy warm-up included); RL tokens: the tokens its policy "
        "generated; wall s: every stage's elapsed seconds, summed.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m kgsynth.eval.papers RUN [LABEL=RUN ...]``: print the table."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.stderr.write("usage: python -m kgsynth.eval.papers RUN [LABEL=RUN ...]\n")
        return 2
    try:
        rows = []
        for arg in args:
            label, _, path = arg.rpartition("=") if "=" in arg else ("", "", arg)
            rows.append(read_run(path, label or None))
    except KGSynthError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 3
    sys.stdout.write(papers_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
