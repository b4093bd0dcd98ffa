"""Where ``kgsynth eval`` writes, through :class:`kgsynth.core.stage_io.StagedOutput` (all files
committed together): an evaluation's folder (``predictions.parquet``, ``metrics.json``,
``eval.png``, ``manifest.json``, and a ``tensorboard``/``wandb`` folder with ``--report-to``)
and a comparison's (``compare.md``, ``compare.png``, ``compare.json``, ``paired.json``,
``manifest.json``)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.core.stage import StageResult
from kgsynth.core.stage_io import StagedOutput
from kgsynth.eval.compare import compare_markdown
from kgsynth.eval.config import MODEL_SUBJECT, EvalConfig
from kgsynth.eval.figures import compare_png, eval_png
from kgsynth.eval.subjects import Subject
from kgsynth.llm.base import LLM

EVAL_FILES = {
    "predictions.parquet",
    "metrics.json",
    "eval.png",
    "manifest.json",
    "tensorboard",
    "wandb",
}
COMPARE_FILES = {"compare.md", "compare.png", "compare.json", "paired.json", "manifest.json"}


def eval_output(
    out_dir: Path,
    *,
    overwrite: bool,
    backend: str,
    subjects: Sequence[Subject],
    questions: Path,
    qtype_file: Path | None,
    kg: str | None,
    cache: Path | None,
    config: Path | None,
) -> StagedOutput:
    """The staged evaluation folder; refused when it is a model checkpoint (its manifest.json
    and files would replace the checkpoint's own). Its inputs: the question file, the KG, the
    checkpoints of an hf run, the request cache and the config file."""
    model = subjects[0].model
    hf = backend == "hf"
    if (out_dir / "config.json").is_file() or (hf and out_dir.resolve() == Path(model).resolve()):
        raise ConfigError(f"--out: {out_dir} is a model checkpoint; choose another folder")
    untrained = next((s.model for s in subjects if s.name == "untrained"), None)
    return StagedOutput(
        out_dir,
        folder=True,
        overwrite=overwrite,
        names=EVAL_FILES,
        inputs=[
            ("--questions", questions),
            ("--qtype-file", qtype_file),
            ("--kg", kg),
            ("--model", model if hf else None),
            ("--baseline-model", untrained if hf else None),
            ("--cache", cache),
            ("--config", config),
        ],
    )


def write_eval(
    staged: StagedOutput,
    result: StageResult,
    cfg: EvalConfig,
    *,
    label: str,
    questions: Path,
    backend: str,
    subjects: Sequence[Subject],
    clients: Mapping[str, LLM],
    started: float,
) -> dict[str, Any]:
    """Write the evaluation into ``staged`` and commit it; returns ``metrics.json``'s content."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.core.manifest import sha256_file, write_manifest
    from kgsynth.core.schema import PREDICTION_SCHEMA

    metrics = {"label": label, "questions_file": str(questions), **result.stats}
    out_dir = staged.out
    paths = {
        "predictions": out_dir / "predictions.parquet",
        "metrics": out_dir / "metrics.json",
        "png": out_dir / "eval.png",
    }
    pq.write_table(
        pa.Table.from_pylist(result.accepted, schema=PREDICTION_SCHEMA),
        staged.path("predictions.parquet"),
    )
    staged.path("metrics.json").write_text(
        json.dumps(metrics, indent=2, ensure_ascii=False, default=str) + "\n"
    )
    eval_png(metrics, staged.path("eval.png"))
    if cfg.report_to != "none":
        _report_to(cfg.report_to, staged, label, metrics)
    write_manifest(
        staged.path("manifest.json"),
        stage="eval",
        label=label,
        config=cfg.recorded(),
        input={
            "questions": str(questions),
            "sha256": sha256_file(questions),
            "rows": metrics["counts"]["questions"],
            "limit": cfg.limit,
        },
        model={"backend": backend, "model": subjects[0].model},
        baselines={s.name: {"model": s.model, "tools": s.tools} for s in subjects[1:]},
        kg=metrics["kg"],
        llm={name: c.describe() for name, c in clients.items()},
        output={
            **{k: str(v) for k, v in paths.items()},
            "prediction_rows": len(result.accepted),
        },
        elapsed_s=round(time.perf_counter() - started, 3),
    )
    staged.commit()
    return metrics


def _report_to(backend: str, staged: StagedOutput, label: str, metrics: dict[str, Any]) -> None:
    """The summary metrics (overall, and by hops) mirrored to tensorboard or wandb."""
    from kgsynth.core.tracking import Tracker, scalars

    tracker = Tracker(backend, staged.staging, name=f"eval-{label or MODEL_SUBJECT}")
    values = scalars(metrics["overall"], "eval/")
    for hops, cell in (metrics.get("breakdowns", {}).get("hops") or {}).items():
        values.update(scalars(cell, f"eval/{hops}-hop/"))
    tracker.log(0, values)
    tracker.close()


def compare_output(out_dir: Path, folders: Sequence[Path], *, overwrite: bool) -> StagedOutput:
    """The staged comparison folder; the compared folders are its inputs."""
    return StagedOutput(
        out_dir,
        folder=True,
        overwrite=overwrite,
        inputs=[("--compare", d) for d in folders],
        names=COMPARE_FILES,
    )


def write_compare(staged: StagedOutput, result: StageResult, folders: Sequence[Path]) -> None:
    """Write the comparison (markdown with its sources, figure, rows, manifest) and commit it."""
    from kgsynth.core.manifest import write_manifest

    rows = result.accepted
    paired = result.stats.get("paired", [])
    md = staged.out / "compare.md"
    sources = "\n".join(f"- {r['label']}: `{r['source']}`" for r in rows)
    staged.path("compare.md").write_text(
        "# Evaluations compared\n\nMeans over runs; cells by hop read EM / F1 / Hits@1.\n\n"
        + compare_markdown(rows, paired)
        + f"\n![compare](compare.png)\n\nSources:\n\n{sources}\n"
    )
    compare_png(rows, staged.path("compare.png"))
    staged.path("compare.json").write_text(json.dumps(rows, indent=2) + "\n")
    staged.path("paired.json").write_text(json.dumps(paired, indent=2) + "\n")
    write_manifest(
        staged.path("manifest.json"),
        stage="eval compare",
        input={"folders": [str(d) for d in folders]},
        output={"markdown": str(md), "rows": len(rows), "paired": paired},
    )
    staged.commit()
