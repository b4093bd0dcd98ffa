"""The options of ``kgsynth walk`` (:class:`WalkConfig`) and the names files they point at."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError, InputFileError, KGSynthError

STRUCTURE_RE = re.compile(r"^(chain-[1-5]|2I|IP|PI|count|superlative|comparative|time)$")
# constraint walks (kgsynth.walk.constraints): a set from a topic entity, counted or filtered
CONSTRAINT_STRUCTURES = ("count", "superlative", "comparative", "time")
DEFAULT_STRUCTURES = "chain-1:0.1,chain-2:0.25,chain-3:0.25,2I:0.2,IP:0.1,PI:0.1"
# how a hop picks its relation: GraphWalker's Alg. 1 (App. B.1, line 8 and 12: the entity's
# outgoing relations, one drawn uniformly) or kgsynth's (either direction, each relation type
# weighted by frequency ** -relation_balance)
RELATION_SAMPLINGS = ("weighted-both", "uniform-out")
DEFAULT_RELATION_BALANCE = 0.5


class WalkError(KGSynthError):
    """The KG could not yield the requested walks."""


@dataclass(frozen=True)
class WalkConfig:
    """Options of ``kgsynth walk``: one flag per field, named as the field."""

    n: int = option(1000, "Walks to accept.")
    seed: int = option(0, "Random seed.")
    structures: str = option(
        DEFAULT_STRUCTURES,
        "Structure mix name:weight,… of chain-1..chain-5, 2I, IP, PI, count, superlative, "
        "comparative, time.",
    )
    min_fanout: int = option(1, "d_min: fewest neighbours along a hop's relation.", advanced=True)
    max_fanout: int = option(20, "d_max: most neighbours along a hop's relation.", advanced=True)
    max_answers: int = option(10, "Reject walks with more answers.")
    wide_share: float = option(
        0.0,
        "The share of chain-1 attempts that take a relation with more than --max-fanout "
        'neighbours, up to --wide-max-answers (questions with many answers: "who plays '
        'Defender?"); such a walk may have that many answers.',
        advanced=True,
    )
    wide_max_answers: int = option(
        200,
        "--wide-share: the most neighbours, and answers, of a wide chain-1 walk.",
        advanced=True,
    )
    relation_sampling: Literal["weighted-both", "uniform-out"] = option(
        "weighted-both",
        "How a hop picks its relation: weighted-both (outgoing and incoming relations, each "
        "type weighted frequency ** -relation_balance) or uniform-out (GraphWalker Alg. 1, "
        "App. B.1: only the entity's outgoing relations, drawn uniformly; a conjunction's "
        "branches run out of their topic entities).",
        advanced=True,
    )
    relation_balance: float = option(
        DEFAULT_RELATION_BALANCE,
        "--relation-sampling weighted-both: relation weight = frequency ** -balance (0: "
        "uniform over relation types).",
        advanced=True,
    )
    relations: str | None = option(
        None, "Whitelist file: relation names, one per line.", panel="Inputs"
    )
    exclude_relations: str | None = option(
        None, "Blacklist file: relation names, one per line.", panel="Inputs", advanced=True
    )
    seeds: str | None = option(None, "File of entity names to start walks from.", panel="Inputs")
    relations_from: str | None = option(
        None,
        "Benchmark file (WebQSP, CWQ, GrailQA or GraphQuestions .json): walk only the relations "
        "its gold SPARQL uses (GraphWalker's predicate set P); instead of --relations.",
        panel="Inputs",
        advanced=True,
    )
    seeds_from: str | None = option(
        None,
        "Benchmark file: start walks from its questions' topic entities, by id (GraphWalker's "
        "seed set E); instead of --seeds.",
        panel="Inputs",
        advanced=True,
    )
    shard: str = option(
        "0/1",
        "i/N: this run's share; shards merge without duplicates.",
        panel="Launch",
        advanced=True,
    )
    chunk_size: int = option(250, "Walks per resumable chunk.", panel="Launch", advanced=True)
    max_attempts_per_walk: int = option(
        500,
        "Give a structure up when its attempts exceed this many per accepted walk (+1).",
        advanced=True,
    )
    max_base: int = option(
        30,
        "Constraint walks: most members of the set counted or filtered (count: <= this).",
        advanced=True,
    )
    constraint_hops: int = option(
        2, "Constraint walks: most hops (1 or 2) from the topic entity to the set.", advanced=True
    )
    workers: int = option(
        1,
        "Processes sampling attempts side by side; the output is the same as with 1.",
        panel="Launch",
    )

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1 (got {self.n})")
        if self.min_fanout < 1 or self.max_fanout < self.min_fanout:
            raise ConfigError(
                f"--min-fanout/--max-fanout: need 1 <= min <= max (got {self.min_fanout}, {self.max_fanout})"
            )
        if self.max_answers < 1:
            raise ConfigError(f"--max-answers must be >= 1 (got {self.max_answers})")
        if not 0.0 <= self.wide_share <= 1.0:
            raise ConfigError(f"--wide-share must be within [0, 1] (got {self.wide_share})")
        if self.wide_share and self.wide_max_answers <= self.max_fanout:
            raise ConfigError(
                f"--wide-max-answers must be above --max-fanout ({self.max_fanout}; got "
                f"{self.wide_max_answers})"
            )
        if self.relation_balance < 0:
            raise ConfigError(f"--relation-balance must be >= 0 (got {self.relation_balance})")
        if self.relation_sampling not in RELATION_SAMPLINGS:
            raise ConfigError(
                f"--relation-sampling must be {' or '.join(RELATION_SAMPLINGS)} "
                f"(got {self.relation_sampling!r})"
            )
        if self.relation_sampling == "uniform-out" and (
            self.relation_balance != DEFAULT_RELATION_BALANCE
        ):
            raise ConfigError(
                "--relation-balance applies to --relation-sampling weighted-both only "
                f"(uniform-out draws relations uniformly; got {self.relation_balance})"
            )
        if self.chunk_size < 1 or self.max_attempts_per_walk < 1:
            raise ConfigError("--chunk-size and --max-attempts-per-walk must be >= 1")
        if self.max_base < 2 or self.constraint_hops not in (1, 2):
            raise ConfigError(
                f"--max-base must be >= 2 and --constraint-hops 1 or 2 "
                f"(got {self.max_base}, {self.constraint_hops})"
            )
        if self.relations and self.relations_from:
            raise ConfigError("give --relations or --relations-from, not both")
        if self.seeds and self.seeds_from:
            raise ConfigError("give --seeds or --seeds-from, not both")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"--workers must be between 1 and 256 (got {self.workers})")
        self.structure_weights()
        self.shard_index()

    def structure_weights(self) -> dict[str, float]:
        """``chain-2:0.3,2I:0.7`` as a dict; names and weights checked."""
        weights: dict[str, float] = {}
        for part in self.structures.split(","):
            if not part.strip():
                continue
            name, _, weight = part.strip().partition(":")
            if not STRUCTURE_RE.match(name):
                raise ConfigError(
                    f"--structures: unknown structure {name!r}; use chain-1..chain-5, 2I, IP, PI, "
                    "count, superlative, comparative, time"
                )
            try:
                w = float(weight) if weight else 1.0
            except ValueError:
                raise ConfigError(
                    f"--structures: weight of {name} is not a number: {weight!r}"
                ) from None
            if not math.isfinite(w) or w < 0:
                raise ConfigError(
                    f"--structures: weight of {name} must be a finite number >= 0 (got {weight})"
                )
            weights[name] = weights.get(name, 0.0) + w
        if not weights or sum(weights.values()) <= 0:
            raise ConfigError("--structures: give at least one structure with a positive weight")
        return weights

    def shard_index(self) -> tuple[int, int]:
        m = re.fullmatch(r"(\d+)/(\d+)", self.shard.strip())
        if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
            raise ConfigError(f"--shard must be i/N with 0 <= i < N (got {self.shard!r})")
        return int(m.group(1)), int(m.group(2))

    def quotas(self) -> dict[str, int]:
        """Accepted walks per structure: ``n`` split by weight (largest remainder)."""
        weights = self.structure_weights()
        total = sum(weights.values())
        raw = {k: self.n * w / total for k, w in weights.items()}
        quotas = {k: math.floor(v) for k, v in raw.items()}
        rest = self.n - sum(quotas.values())
        for k in sorted(raw, key=lambda k: (-(raw[k] - quotas[k]), k))[:rest]:
            quotas[k] += 1
        return quotas


def read_lines(path: str, what: str) -> list[tuple[int, str]]:
    """``(line number, stripped line)`` of a names file, blank and ``#`` lines left out."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputFileError(path, f"cannot read {what} file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputFileError(
            path,
            f"{what} file is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
        ) from None
    return [
        (i, ln.strip())
        for i, ln in enumerate(lines, 1)
        if ln.strip() and not ln.lstrip().startswith("#")
    ]


def read_list(path: str, what: str) -> list[str]:
    return [ln for _, ln in read_lines(path, what)]
