"""Early stopping for GRPO and the SFT stages (``kgsynth train rl|stage1|stage2
--select-questions``): once training is done, the starting model, every checkpoint and the
last weights answer the same validation questions greedily, as ``kgsynth eval`` would, and the
run keeps the weights with the best Hits@1 (a tie goes to the later). The best replaces the
starting weights (stage 1, which starts from a fresh model: the last weights) only when it
beats them beyond chance: an exact sign test on the questions the two answer differently, at
``alpha`` (0.05; 1 keeps the plain best). Picking the best of several noisy scores favours
a lucky one: on 2026-11-26 a checkpoint 3 questions of 150 above its start on validation was
kept, and answered 6 more of 300 dev questions wrong than its start (1 better, 7 worse).
Every candidate stays on disk: the last weights are also
saved as ``checkpoints/step-N`` before the chosen ones replace them, and ``selection.json``
(and ``rl_summary.json``'s ``selection``) lists each candidate's score.

The validation questions must be questions the run never trains on (``make all`` draws them
from walks with another seed); selecting on the benchmark itself would tune against it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kgsynth.core.cores import all_cores
from kgsynth.core.errors import ConfigError
from kgsynth.core.modelio import is_adapter
from kgsynth.train.grpo_config import CHECKPOINTS, RUN_FILES

SELECTION = "selection.json"
WEIGHTS = "model.safetensors"


def candidates(
    run_dir: Path, init: str | Path | None, steps: int, prefix: str = "step-"
) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every model the run passed through, in order: the starting model
    (step 0; none for stage 1, which starts from a fresh model: ``init`` None), each whole
    checkpoint (``checkpoints/<prefix>N``: GRPO's ``step-N``, the SFT trainer's
    ``checkpoint-N``), and the run's last weights (``steps``)."""
    found = [] if init is None else [(0, Path(init))]
    for ckpt in (run_dir / CHECKPOINTS).glob(f"{prefix}*"):
        step = ckpt.name.removeprefix(prefix)
        if step.isdigit() and 0 < int(step) < steps and (ckpt / WEIGHTS).is_file():
            found.append((int(step), ckpt))
    found.append((steps, run_dir))
    return sorted(found)


def _score(
    folder: Path,
    records: list[Any],
    graph: Any,
    agent: Any,
    batch_size: int,
    cache: str | Path | None = None,
) -> tuple[float, dict[str, float]]:
    """Greedy Hits@1 of the model in ``folder`` on ``records``, as ``kgsynth eval`` scores it,
    and each question's; through the request cache ``cache`` when given."""
    from kgsynth.eval.config import EvalConfig
    from kgsynth.eval.subjects import evaluate
    from kgsynth.llm import make_llm

    cfg = EvalConfig(agent=agent).for_policy("hf", str(folder))
    llm = make_llm("hf", model=str(folder), batch_size=batch_size, cache=cache)
    try:
        rows, metrics = evaluate(records, llm, graph, cfg)
    finally:
        llm.close()
    return float(metrics["overall"]["hits_at_1"]), {
        r["question_id"]: float(r["hits_at_1"]) for r in rows
    }


def select_weights(
    run_dir: Path,
    init: str | Path,
    steps: int,
    questions: str | Path,
    limit: int,
    graph: Any,
    agent: Any,
    *,
    alpha: float = 0.05,
    batch_size: int = 64,
    cache: str | Path | None = None,
    notify: Callable[[str], None] | None = None,
    prefix: str = "step-",
    run_files: tuple[str, ...] = RUN_FILES,
) -> dict[str, Any]:
    """Score every candidate on the first ``limit`` of ``questions``; leave the best weights in
    ``run_dir`` (the reference's unless the best beats them at ``alpha``) and return what
    ``selection.json`` records. The reference is the starting model, or with ``init`` None
    (stage 1) the last weights, what training without a selection would leave. ``prefix``
    names the run's checkpoints and ``run_files`` the files of the run folder that are not part
    of the model (see :func:`candidates`)."""
    from kgsynth.eval.config import load_questions
    from kgsynth.eval.paired import sign_split

    cands = candidates(run_dir, init, steps, prefix)
    lacking = [str(folder) for _, folder in cands if not (folder / WEIGHTS).is_file()]
    if lacking or is_adapter(run_dir):
        raise ConfigError(
            "--select-questions needs whole weights (model.safetensors) in every candidate, "
            f"not a LoRA adapter: {', '.join(lacking) or run_dir}"
        )
    records = load_questions(Path(questions), limit=limit)
    # the reference is scored first, so each later line can say how the candidate compares
    ref_step, ref_name = (steps, "the last weights") if init is None else (0, "the start")
    order = sorted(cands, key=lambda c: c[0] != ref_step)
    scores: list[dict[str, Any]] = []
    reference: dict[str, float] = {}
    for step, folder in order:
        with all_cores():  # training is over: the answers get the whole machine
            hits, per_question = _score(folder, records, graph, agent, batch_size, cache)
        entry: dict[str, Any] = {"step": step, "hits_at_1": round(hits, 6)}
        said = f"select: step {step}: validation Hits@1 {hits:.3f} ({len(records)} questions)"
        if step == ref_step:
            reference = per_question
        else:
            better, worse, p = sign_split(reference, per_question)
            entry.update(better=better, worse=worse, sign_test_p=round(p, 6))
            said += f", {better} better and {worse} worse than {ref_name} (p {p:.3f})"
        scores.append(entry)
        if notify:
            notify(said)
    scores.sort(key=lambda s: s["step"])
    ref = next(s for s in scores if s["step"] == ref_step)
    top = max(scores, key=lambda s: (s["hits_at_1"], s["step"]))
    significant = (
        top is ref or alpha >= 1 or (top["better"] > top["worse"] and top["sign_test_p"] < alpha)
    )
    best = top if significant else ref
    if best["step"] != steps:
        # keep the last weights as a checkpoint of their own (a model folder: weights, config,
        # tokenizer, system prompt; the SFT trainer saved one at its last step already), then
        # put the chosen ones in place
        last = run_dir / CHECKPOINTS / f"{prefix}{steps}"
        if not (last / WEIGHTS).is_file():
            last.mkdir(parents=True, exist_ok=True)
            for f in run_dir.iterdir():
                if f.is_file() and f.name not in run_files and not f.name.startswith("."):
                    shutil.copy2(f, last / f.name)
        chosen = dict(cands)[best["step"]]
        tmp = run_dir / f".{WEIGHTS}.tmp"
        shutil.copy2(chosen / WEIGHTS, tmp)
        tmp.replace(run_dir / WEIGHTS)
    record = {
        "questions": str(questions),
        "limit": limit,
        "evaluated": len(records),
        "metric": "hits_at_1",
        "alpha": alpha,
        "reference_step": ref_step,
        "scores": scores,
        "best_step": top["step"],
        "chosen_step": best["step"],
        "chosen_hits_at_1": best["hits_at_1"],
        "last_step": steps,
    }
    (run_dir / SELECTION).write_text(json.dumps(record, indent=2))
    return record


def selection_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What a run's summary adds from :func:`select_weights`' record: the record itself and
    the scalars a report's summary table shows."""
    return {
        "selection": record,
        "selected_step": record["chosen_step"],
        "selected_val_hits_at_1": record["chosen_hits_at_1"],
        "start_val_hits_at_1": next(
            s["hits_at_1"] for s in record["scores"] if s["step"] == record.get("reference_step", 0)
        ),
    }
