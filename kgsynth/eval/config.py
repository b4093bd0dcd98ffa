"""What ``kgsynth eval`` measures and how: the metric names, the subjects (what is evaluated), the
options (:class:`EvalConfig`) and the checks a question file must pass before it is evaluated."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kgsynth.agent.carried import ALLOW_TOOLSET_CHANGE_HELP
from kgsynth.agent.config import AgentConfig
from kgsynth.core.config import config_record, option
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.llm.base import GenerationParams

if TYPE_CHECKING:  # the CLI reads this module on every start: the agent layer loads when used
    from kgsynth.agent.tools import ToolConfig
    from kgsynth.datasets.qafiles import QARecord

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
MODEL_SUBJECT = "model"
NO_TOOLS_SUBJECT = "no-tools"
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
    """Options of ``kgsynth eval`` (the agent's limits match synthesis and RL by default).

    ``limit``, ``baseline`` and ``baseline_model`` say which questions and which baselines run;
    the manifest records them beside the config (``input.limit``, ``baselines``), so
    :meth:`recorded` leaves them out of ``config``."""

    runs: int = option(1, "Runs per question (run r uses seed + r).")
    temperature: float = option(0.0, "Sampling temperature (0: greedy).")
    top_p: float = option(1.0, "Nucleus sampling.", advanced=True)
    # the agent's settings, shared with synthesis and RL; given and read under their own names
    agent: AgentConfig = field(default_factory=AgentConfig)
    report_to: str = option(
        "none",
        "Mirror the metrics to tensorboard (RUN/tensorboard; `tensorboard --logdir RUN`) or "
        "wandb (needs `pip install wandb`), or none.",
        panel="Output",
        advanced=True,
    )
    seed: int = option(0, "Sampling seed of run 0.")
    limit: int | None = option(
        None, "Use only the first K questions.", record=False, panel="Inputs"
    )
    baseline: tuple[str, ...] = option(
        (),
        "Also evaluate a baseline, scored the same way (repeatable): untrained (the model the "
        "checkpoint was trained from, as the agent) or no-tools (this model answering without "
        "tools).",
        multiple=True,
        record=False,
    )
    baseline_model: str | None = option(
        None,
        "The untrained baseline's checkpoint folder (hf) or model name (openai); default: "
        "followed from the checkpoint's manifest.json start_from.",
        record=False,
        advanced=True,
    )
    base_model: str | None = option(
        None,
        "The base model folder of a LoRA checkpoint (--llm hf), where it is no longer where "
        "the adapter says (a run folder moved without its base). \\[default: the folder "
        "adapter_config.json names, found relative to the checkpoint first]",
        panel="Model",
        advanced=True,
    )
    allow_toolset_change: bool = option(
        False, ALLOW_TOOLSET_CHANGE_HELP, panel="Agent", advanced=True, record=False
    )

    def __post_init__(self) -> None:
        if isinstance(self.baseline, str):  # a YAML or flag value "untrained,no-tools"
            object.__setattr__(self, "baseline", self.baseline.split(","))
        object.__setattr__(self, "baseline", tuple(b.strip() for b in self.baseline if b.strip()))
        unknown = [b for b in self.baseline if b not in BASELINES]
        if unknown:
            raise ConfigError(
                f"--baseline: unknown {', '.join(unknown)}; choose from {', '.join(BASELINES)}"
            )
        if self.baseline_model and "untrained" not in self.baseline:
            raise ConfigError("--baseline-model goes with --baseline untrained")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1 (got {self.limit})")
        if self.runs < 1:
            raise ConfigError(f"--runs must be >= 1 (got {self.runs})")
        if not 0.0 <= self.temperature <= 5.0:
            raise ConfigError(f"--temperature must be in [0, 5] (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in (0, 1] (got {self.top_p})")
        from kgsynth.core.tracking import check_report_to

        check_report_to(self.report_to)
        if self.agent.top_k_relations < 1 or self.agent.max_triples_per_relation < 1:
            raise ConfigError("--top-k-relations and --max-triples-per-relation must be >= 1")
        self.agent.check_turn_tokens()

    @property
    def greedy_repeats(self) -> bool:
        """Several runs at temperature 0: greedy runs of a local model are identical."""
        return self.runs > 1 and self.temperature == 0

    def recorded(self) -> dict[str, Any]:
        """The ``config`` that ``metrics.json`` and the manifest record: every field but
        those recorded elsewhere (``record=False``)."""
        return config_record(self)

    def tool_config(self) -> ToolConfig:
        """What the KG tools show (the agent's settings)."""
        return self.agent

    def for_policy(self, backend: str, model: str) -> EvalConfig:
        """This config with the checkpoint's stored system prompt (an hf checkpoint is
        prompted the way it was trained, and its untrained start alike) and its per-turn token
        cap at most the model's positions (one warning where it is lowered)."""
        if backend != "hf":
            return self
        from kgsynth.agent.loop import stored_system_prompt
        from kgsynth.core.modelio import fit_to_model

        text = self.agent.system_text
        turn_tokens = fit_to_model("max_turn_tokens", self.agent.max_turn_tokens, model)
        agent = dataclasses.replace(
            self.agent,
            system_text=stored_system_prompt(model) if text is None else text,
            max_turn_tokens=turn_tokens,
        )
        return dataclasses.replace(self, agent=agent)

    def params(self, run: int) -> GenerationParams:
        """Sampling parameters of run ``run``: its own seed, so N runs are N samples."""
        return GenerationParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.agent.max_turn_tokens,
            seed=self.seed + run,
        )


def check_records(records: Sequence[QARecord], path: str | Path) -> None:
    """Fail on the first question that cannot be evaluated (no gold answer, no topic entity, a
    repeated ``question_id``), naming the file, line/row and field. A benchmark question
    (``source_format`` set: WebQSP, CWQ, GrailQA, GraphQ) may have no topic entity."""
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
        if not rec.topic_names and not rec.topic_ids and rec.source_format is None:
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
    from kgsynth.datasets.qafiles import read_questions

    records = read_questions(path, qtype_file=qtype_file, limit=limit)
    check_records(records, path)
    return records


def question_id(rec: QARecord) -> str:
    return rec.question_id or f"line-{rec.line}"
