"""A GRPO run: its spec (what every launched worker reads), its questions, and what it
writes: ``save_pretrained`` folders (weights gathered under ZeRO-3), the
resume state of each ``checkpoints/step-N`` (written last, so a half-written checkpoint is
never resumed from), and, at the end, ``rl_config.json``, ``rl.png`` and ``rl_summary.json``."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.agent.rewards import Gold
from kgsynth.core.config import config_from_record, config_record
from kgsynth.core.errors import InputFileError
from kgsynth.core.modelio import record_adapter_base
from kgsynth.train.core import store_system_prompt
from kgsynth.train.grpo_config import (
    CHECKPOINTS,
    PLOT,
    RESUME_STATE,
    RL_CONFIG,
    SUMMARY,
    GRPOConfig,
)
from kgsynth.train.grpo_dist import Policy
from kgsynth.train.plots import plot_rl


@dataclass(frozen=True)
class RLQuestion:
    """A question to roll out, with its topic entities and gold answers. ``topic_ids``: a
    benchmark's topic entities by id (CWQ names none: :func:`with_topic_names` names them)."""

    question: str
    topic_names: list[str]
    answers: list[str]
    question_id: str
    topic_ids: tuple[str, ...] = ()
    # a benchmark's answers by id (parallel to ``answers``) and their aliases: rewards count a
    # predicted id or alias as the answer it names
    answer_ids: tuple[str | None, ...] = ()
    aliases: tuple[tuple[str, ...], ...] = ()
    # the gold SPARQL, where the file has one: ISP's progress reward (COUNT and superlative
    # questions, App. F.8) and question curriculum (App. E.1) read it
    sparql: str | None = None

    def gold(self) -> Gold:
        """What a rollout of this question is scored against."""
        return Gold(
            answers=self.answers,
            question=self.question,
            topic_names=self.topic_names,
            answer_ids=self.answer_ids,
            aliases=self.aliases,
            sparql=self.sparql,
        )


def read_rl_questions(path: str | Path) -> list[RLQuestion]:
    """Questions with topic entities and gold answers (questions.parquet, MetaQA txt, JSONL,
    or a WebQSP/CWQ/GrailQA/GraphQuestions .json, whose questions may have no topic entity)."""
    from kgsynth.datasets.qafiles import read_questions

    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "does not exist")
    out = []
    for r in read_questions(path):
        if not r.topic_names and not r.topic_ids and r.source_format is None:
            raise InputFileError(path, f"row {r.line}: no topic entity (topic_names)")
        if not r.answer_names:
            raise InputFileError(path, f"row {r.line}: no gold answer (answer_names)")
        out.append(
            RLQuestion(
                r.question,
                list(r.topic_names),
                list(r.answer_names),
                f"{path.name}:{r.line}",
                tuple(r.topic_ids),
                tuple(r.answer_ids or ()),
                tuple(tuple(a) for a in (r.aliases or ())),
                r.sparql,
            )
        )
    if not out:
        raise InputFileError(path, "holds no questions")
    return out


def with_topic_names(questions: Sequence[RLQuestion], graph: Any) -> list[RLQuestion]:
    """``questions`` with the topics of those given by id only (CWQ) named from the KG
    (``graph``: a :class:`~kgsynth.kg.graph.KGGraph`; an id it does not name is left out)."""
    out = []
    for q in questions:
        if not q.topic_names and q.topic_ids:
            names = (graph.label(graph.profile.entity_iri(t)) for t in q.topic_ids)
            q = dataclasses.replace(q, topic_names=[n for n in names if n])
        out.append(q)
    return out


@dataclass(frozen=True)
class RLSpec:
    """Everything a GRPO process needs; launched workers read it from ``OUT/rl_spec.json``."""

    questions: str
    kg: str
    profile: str | None
    out: str
    config: GRPOConfig

    def write(self, path: str | Path) -> None:
        """``OUT/rl_spec.json``: what every launched worker reads (``kind: rl``)."""
        data = {"kind": "rl", **dataclasses.asdict(self), "config": config_record(self.config)}
        Path(path).write_text(json.dumps(data, indent=2))

    @classmethod
    def read(cls, path: str | Path) -> RLSpec:
        data = json.loads(Path(path).read_text())
        return cls(
            data["questions"], data["kg"], data["profile"], data["out"],
            config_from_record(GRPOConfig, data["config"]),
        )  # fmt: skip


def save_model(
    policy: Policy, tok: Any, folder: Path, system_text: str | None = None, agent: Any = None
) -> None:
    """A ``save_pretrained`` folder (weights gathered under ZeRO-3), with the tokenizer, the
    stored system prompt and the agent settings (an AgentConfig: the rollouts') the policy was
    trained with; a LoRA policy's adapter names its base as
    :func:`~kgsynth.core.modelio.record_adapter_base` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        store_system_prompt(folder, system_text, agent)
    engine = policy.engine
    if engine is not None and engine.zero_optimization_stage() == 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # every rank takes part
        if rank0:
            policy.module.save_pretrained(folder, state_dict=state)
    elif rank0:
        policy.module.save_pretrained(folder)
    if rank0:
        tok.save_pretrained(folder)
        record_adapter_base(folder)  # a LoRA run's base: absolute and relative to the folder


def save_resume_state(folder: Path, data: dict[str, Any]) -> None:
    """Everything a killed run needs to go on exactly where this step ended, written last and
    atomically, so a checkpoint without it is not resumed from."""
    import torch

    tmp = folder / (RESUME_STATE + ".tmp")
    torch.save(data, tmp)
    os.replace(tmp, folder / RESUME_STATE)


def last_resumable(out: Path) -> Path | None:
    """The newest ``checkpoints/step-N`` holding a whole resume state, if any."""
    root = out / CHECKPOINTS
    if not root.is_dir():
        return None
    steps = [
        (int(f.name.split("-")[1]), f)
        for f in root.iterdir()
        if f.name.startswith("step-") and f.name[5:].isdigit() and (f / RESUME_STATE).is_file()
    ]
    return max(steps)[1] if steps else None


def run_summary(
    history: Sequence[dict[str, Any]],
    qs: Sequence[Any],
    started: float,
    device: str,
    dtype: Any,
    totals: dict[str, int],
    world: int,
) -> dict[str, Any]:
    first = history[: max(1, len(history) // 5)]
    last = history[-max(1, len(history) // 5) :]
    return {
        "steps": len(history),
        "questions": len(qs),
        "reward_first": sum(h["reward"] for h in first) / len(first),
        "reward_last": sum(h["reward"] for h in last) / len(last),
        "mean_step_s": sum(h["step_s"] for h in history) / len(history),
        # of a step: the rollouts (decoding and tool calls); the rest is scoring and the update
        "mean_rollout_s": sum(h["rollout_s"] for h in history) / len(history),
        "mean_rollout_tokens_per_s": sum(h["rollout_tokens_per_s"] for h in history) / len(history),
        "wall_s": round(time.perf_counter() - started, 3),
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "world_size": world,
        **totals,
    }


def write_run_files(spec: RLSpec, history: Sequence[dict[str, Any]], summary: dict) -> None:
    """rl_config.json, rl.png and rl_summary.json (rank 0)."""
    cfg, out = spec.config, Path(spec.out)
    (out / RL_CONFIG).write_text(
        json.dumps(
            {"config": config_record(cfg), "questions": spec.questions, "kg": spec.kg},
            indent=2,
        )
    )
    plot_rl(history, out / PLOT)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))
