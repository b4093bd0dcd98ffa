"""The options of ``kgsynth filter`` (:class:`FilterConfig`) and its reject reasons, in the
order the filters run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError
from kgsynth.metrics import check_metric_name

REASONS = (
    "no_answer",
    "wrong_answer",
    "ungrounded_answer",
    "bad_format",
    "reference_leak",
    "too_long",
    "contamination",
    "duplicate_actions",
    "over_question_cap",
    "balance",
)
"""Every ``reject_reason``, in the order the filters run."""

OUTCOMES = ("em_strict", "hit", "f1", "f1_above", "none")
BALANCE_BY = ("structure", "hops", "none")

MaxSimilarity = Callable[[list[str]], Sequence[float] | np.ndarray]
"""Question texts -> the maximum cosine similarity of each to a benchmark question."""


@dataclass(frozen=True)
class FilterConfig:
    """Options of ``kgsynth filter``; each field is the flag of the same name.

    An integer limit of 0 (or None) switches that limit off.
    """

    outcome: str = option(
        "f1",
        "The answer check: em_strict (predicted set = gold set), hit (some predicted answer is "
        "gold; KnowCoder-A1), f1 (em_strict or F1 >= --f1-threshold), f1_above (F1 strictly "
        "above --f1-threshold: KBQA-R1 Table VII keeps F1 > 0.9) or none.",
    )
    f1_threshold: float = option(0.9, "F1 needed with --outcome f1 or f1_above.")
    grounding: bool = option(
        True, "Every answer must be among the entities the environment returned."
    )
    check_format: bool = option(
        True, "Every assistant turn parses (<think> + one action); the last is an <answer>."
    )
    reference_leak: bool = option(
        True, "Reject referenced trajectories whose messages contain the hint text."
    )
    leak_min_chars: int = option(12, "Hint lines at least this long (stripped) count as leaks.")
    max_chars: int | None = option(16_000, "Most characters in all messages; 0 for no limit.")
    max_turns: int | None = option(None, "Most assistant turns; 0 for no limit.")
    contamination_threshold: float = option(
        0.85, "Reject questions at or above this cosine similarity."
    )
    benchmark: tuple[str, ...] = option(
        (),
        "Benchmark question file(s) (MetaQA txt, JSONL, Parquet) for the contamination filter; "
        "repeatable.",
        multiple=True,
        panel="Inputs",
    )
    dedup_actions: bool = option(True, "Reject a repeat of a question's tool-call sequence.")
    max_per_question: int | None = option(3, "Trajectories kept per question; 0 for no cap.")
    max_per_structure: int | None = option(None, "Trajectories kept per structure; 0 for no cap.")
    balance: str = option(
        "none", "structure, hops or none: cap every group at --balance-factor x the smallest."
    )
    balance_factor: float = option(2.0, "Group cap = floor(factor x smallest group), factor >= 1.")
    upsample_factor: float = option(
        1.0,
        "With --balance: after the caps, copy the accepted rows of every group smaller than the "
        "largest until it has min(largest, floor(factor x its size)) rows (KnowCoder-A1's "
        "upsampling of rare types); 1 copies nothing.",
    )
    seed: int = option(0, "Seed of the upsampling's draw of the rows it copies.")

    def __post_init__(self) -> None:
        if self.outcome == "em":
            check_metric_name("em", "--outcome")
        if self.outcome not in OUTCOMES:
            raise ConfigError(
                f"--outcome must be one of {', '.join(OUTCOMES)} (got {self.outcome!r})"
            )
        if not 0.0 <= self.f1_threshold <= 1.0:
            raise ConfigError(f"--f1-threshold must be within [0, 1] (got {self.f1_threshold})")
        if self.balance not in BALANCE_BY:
            raise ConfigError(
                f"--balance must be one of {', '.join(BALANCE_BY)} (got {self.balance!r})"
            )
        if not (isinstance(self.balance_factor, int | float) and self.balance_factor >= 1.0):
            raise ConfigError(f"--balance-factor must be >= 1 (got {self.balance_factor!r})")
        if not (isinstance(self.upsample_factor, int | float) and self.upsample_factor >= 1.0):
            raise ConfigError(f"--upsample-factor must be >= 1 (got {self.upsample_factor!r})")
        if self.upsample_factor > 1.0 and self.balance == "none":
            raise ConfigError(
                "--upsample-factor copies the rows of small --balance groups: give --balance "
                "structure or hops"
            )
        if not 0.0 < self.contamination_threshold <= 1.0:
            raise ConfigError(
                f"--contamination-threshold must be within (0, 1] (got {self.contamination_threshold})"
            )
        if not isinstance(self.leak_min_chars, int) or self.leak_min_chars < 1:
            raise ConfigError(
                f"--leak-min-chars must be an integer >= 1 (got {self.leak_min_chars!r})"
            )
        for name in ("max_chars", "max_turns", "max_per_question", "max_per_structure"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be an integer >= 0, 0 for no limit (got {value!r})")
            if value == 0:
                object.__setattr__(self, name, None)
        if isinstance(self.benchmark, str | Path):
            object.__setattr__(self, "benchmark", (str(self.benchmark),))
        else:
            object.__setattr__(self, "benchmark", tuple(str(b) for b in self.benchmark or ()))

    def enabled(self, *, contamination: bool = False) -> list[str]:
        """The reasons this configuration can reject for, in filter order."""
        on = {
            "no_answer": self.outcome != "none" or self.grounding,
            "wrong_answer": self.outcome != "none",
            "ungrounded_answer": self.grounding,
            "bad_format": self.check_format,
            "reference_leak": self.reference_leak,
            "too_long": self.max_chars is not None or self.max_turns is not None,
            "contamination": contamination,
            "duplicate_actions": self.dedup_actions,
            "over_question_cap": self.max_per_question is not None,
            "balance": self.max_per_structure is not None or self.balance != "none",
        }
        return [r for r in REASONS if on[r]]
