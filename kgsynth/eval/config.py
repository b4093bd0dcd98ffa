"""What ``kgsynth eval`` measures and how: the metric names, the systems under test, the
options (:class:`EvalConfig`) and the checks a question file must pass before it is evaluated."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kgsynth.agent.tools import RELATION_RANKINGS, RERANK_MODES, ToolConfig
from kgsynth.errors import ConfigError, InputFileError
from kgsynth.llm.base import GenerationParams
from kgsynth.qafiles import QARecord

METRICS = ("em_strict", "hit", "f1", "hits_at_1", "rhits_at_1", "precision", "recall")
SHOWN_METRICS = ("em_strict", "hit", "f1", "hits_at_1", "rhits_at_1")
METRIC_NAMES = {
    "em_strict": "EM (strict)",
    "hit": "Hit",
    "f1": "F1",
    "hits_at_1": "Hits@1",
    "rhits_at_1": "RHits@1",
}
PASS_METRIC = "hit"  # a run counts as correct for pass@k when some answer is gold
UNION_LABEL = "KG-R1 N runs (union)"
BREAKDOWNS = ("hops", "qtype", "structure")
BASELINES = ("untrained", "no-tools")
MODEL_SYSTEM = "model"
NO_TOOLS_SYSTEM = "no-tools"
CI_LEVEL = 0.95
CI_RESAMPLES = 2000
CI_SEED = 0
METRIC_LEGEND = (
    "EM (strict): the predicted set equals the gold set; Hit: some predicted answer is gold "
    "(KnowCoder-A1's and GraphWalker's EM, KG-R1's and ISP's Hit); Hits@1: the first predicted "
    "answer is gold; RHits@1: the share of predicted answers that are gold (KnowCoder-A1's "
    "random pick, as its expected value); F1: set F1."
)
CI_METHOD = (
    "Wilson score interval over questions where every question scores 0 or 1, else "
    f"percentile bootstrap over questions with all their runs ({CI_RESAMPLES} resamples, "
    f"seed {CI_SEED})"
)


@dataclass(frozen=True)
class EvalConfig:
    """Options of ``kgsynth eval`` (the agent's limits match synthesis and RL by default)."""

    runs: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_turns: int = 10
    max_tokens: int = 512
    toolset: str = "graphwalker"
    top_k_relations: int = 10
    max_triples: int = 5
    rerank: str = "none"  # none | llm: GraphWalker's LLM rerank of the BM25 top-20 relations
    relation_ranking: str = "bm25"  # bm25 | hybrid: BM25 plus sentence-encoder similarity
    report_to: str = "none"  # none | tensorboard | wandb: the summary metrics (kgsynth.tracking)
    seed: int = 0
    system_text: str | None = None  # the checkpoint's stored system prompt (hf), if any

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"--runs must be >= 1 (got {self.runs})")
        if not 0.0 <= self.temperature <= 5.0:
            raise ConfigError(f"--temperature must be in [0, 5] (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if self.max_turns < 1 or self.max_tokens < 1:
            raise ConfigError(
                f"--max-turns and --max-tokens must be >= 1 (got {self.max_turns}, {self.max_tokens})"
            )
        if self.toolset not in ("graphwalker", "kgr1"):
            raise ConfigError(f"--tools must be graphwalker or kgr1 (got {self.toolset!r})")
        if self.rerank not in RERANK_MODES:
            raise ConfigError(f"--rerank must be none or llm (got {self.rerank!r})")
        from kgsynth.tracking import check_report_to

        check_report_to(self.report_to)
        if self.relation_ranking not in RELATION_RANKINGS:
            raise ConfigError(
                f"--relation-ranking must be bm25 or hybrid (got {self.relation_ranking!r})"
            )
        if self.top_k_relations < 1 or self.max_triples < 1:
            raise ConfigError("--top-k-relations and --max-triples must be >= 1")

    def tool_config(self) -> ToolConfig:
        return ToolConfig(
            toolset=self.toolset,  # type: ignore[arg-type]
            top_k_relations=self.top_k_relations,
            max_triples_per_relation=self.max_triples,
            rerank=self.rerank,  # type: ignore[arg-type]
            relation_ranking=self.relation_ranking,  # type: ignore[arg-type]
        )

    def for_policy(self, backend: str, model: str) -> EvalConfig:
        """This config with the checkpoint's stored system prompt (an hf checkpoint is
        prompted the way it was trained, and its untrained start alike)."""
        if backend != "hf" or self.system_text is not None:
            return self
        from kgsynth.agent.loop import stored_system_prompt

        return dataclasses.replace(self, system_text=stored_system_prompt(model))

    def params(self, run: int) -> GenerationParams:
        """Sampling parameters of run ``run``: its own seed, so N runs are N samples."""
        return GenerationParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed + run,
        )


def check_records(records: Sequence[QARecord], path: str | Path) -> None:
    """Fail on the first question that cannot be evaluated (no gold answer, no topic entity, a
    repeated ``question_id``), naming the file, line/row and field."""
    if not records:
        raise InputFileError(path, "holds no questions")
    first_line: dict[str, int] = {}
    for rec in records:
        qid = question_id(rec)
        if qid in first_line:
            raise InputFileError(
                path,
                f"field question_id {qid!r} repeats line {first_line[qid]}; runs are "
                "grouped by question_id, so each question needs its own",
                rec.line,
            )
        first_line[qid] = rec.line
        if not rec.answer_names:
            raise InputFileError(
                path, "field answer_names is empty; eval needs gold answers", rec.line
            )
        if not rec.topic_names:
            raise InputFileError(
                path,
                "field topic_names is missing or empty and the question has no [topic entity]; "
                "eval gives the agent its topic entities",
                rec.line,
            )


def load_questions(
    path: Path, *, qtype_file: Path | None = None, limit: int | None = None
) -> list[QARecord]:
    """The questions to evaluate (the first ``limit``), each checked (:func:`check_records`)."""
    from kgsynth.qafiles import read_questions

    records = read_questions(path, qtype_file=qtype_file, limit=limit)
    check_records(records, path)
    return records


def question_id(rec: QARecord) -> str:
    return rec.question_id or f"line-{rec.line}"
