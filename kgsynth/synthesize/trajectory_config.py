"""The options of ``kgsynth synthesize trajectories`` (:class:`TrajectoryConfig`): one flag per
field, named as the field, with its help and its checks here."""

from __future__ import annotations

from dataclasses import dataclass

from kgsynth.agent.loop import PROMPT_STYLES
from kgsynth.agent.tools import RELATION_RANKINGS, RERANK_MODES, ToolConfig
from kgsynth.config import option
from kgsynth.errors import ConfigError

MODES = ("oracle", "referenced", "free")
STRATA = ("none", "structure", "hops")
SPLITS = ("all", "train", "heldout")


@dataclass(frozen=True)
class TrajectoryConfig:
    """Options of ``kgsynth synthesize trajectories``."""

    mode: str = option(
        "oracle",
        "oracle (replayed walks + thoughts), referenced (policy sees the gold actions) or free.",
    )
    samples: int = option(1, "Episodes per question (free/referenced).")
    temperature: float = option(0.7, "Policy temperature.")
    max_turns: int = option(10, "Turn limit, then one forced answer.")
    max_tokens: int = option(512, "Tokens per turn.")
    toolset: str = option("graphwalker", "Tool set: graphwalker or kgr1.", aliases=("--tools",))
    top_k_relations: int = option(10, "Relations get_relations shows.")
    max_triples: int = option(5, "Triples shown per relation.")
    rerank: str = option(
        "none",
        "none, or llm: the LLM (--llm) reorders get_relations' BM25 top 20 before the top k is "
        "kept (GraphWalker, Table 8); cached like every request.",
    )
    relation_ranking: str = option(
        "bm25",
        "How get_relations ranks an entity's relations: bm25 (GraphWalker), or hybrid: BM25 "
        "plus the question's similarity to the relation's words under the bundled "
        "all-MiniLM-L6-v2 encoder. Use the same in synthesis, RL and eval.",
    )
    seed: int = option(0, "Sampling seed (sample i uses seed + i).")
    system_prompt: str = option(
        "full",
        "The agent's system prompt: full or short (one line, for small models trained from "
        "scratch). An --llm hf checkpoint that stores the prompt it was trained with uses that "
        "one.",
    )
    # the stored trajectory keeps the plain prompt; the reflection text only shapes the sample
    reflection: bool = option(
        False,
        "free/referenced: sample with reflection instructions added to the system prompt "
        "(GraphRoll-style: notice a failed step, go back, check the answer before giving it; "
        "prompts/reflection.j2); the stored trajectories keep the plain prompt.",
    )
    workers: int = option(
        1,
        "oracle with --llm template: replay the questions in N processes over contiguous "
        "shards (each opens the KG itself); the output is the same as with one.",
    )
    fan_out: int = option(
        1,
        "oracle: follow a chain's next hop from up to this many of the entities the hop before "
        "reached, so the replay observes the whole answer set.",
    )
    stratify: str = option(
        "none",
        "With --limit: draw the K questions stratified by structure or hops (equal shares, "
        "seeded; GraphRoll's sampling for expert rollouts) instead of the first K; none takes "
        "the first K.",
    )
    split: str = option(
        "all",
        "all, train or heldout: a stable split by question_id hash, so stage 1 and the stage-2 "
        "rollouts can use disjoint questions.",
    )
    heldout_fraction: float = option(0.1, "Share of questions in the heldout split.")
    limit: int | None = option(None, "Use only the first K questions.")

    def __post_init__(self) -> None:
        if self.system_prompt not in PROMPT_STYLES:
            raise ConfigError(
                f"--system-prompt must be one of {', '.join(PROMPT_STYLES)} (got {self.system_prompt!r})"
            )
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if self.toolset not in ("graphwalker", "kgr1"):
            raise ConfigError(f"--tools must be graphwalker or kgr1 (got {self.toolset!r})")
        if self.rerank not in RERANK_MODES:
            raise ConfigError(f"--rerank must be none or llm (got {self.rerank!r})")
        if self.relation_ranking not in RELATION_RANKINGS:
            raise ConfigError(
                f"--relation-ranking must be bm25 or hybrid (got {self.relation_ranking!r})"
            )
        if self.samples < 1 or self.max_turns < 1 or self.max_tokens < 1:
            raise ConfigError("--samples, --max-turns and --max-tokens must be >= 1")
        if self.split not in SPLITS:
            raise ConfigError(f"--split must be all, train or heldout (got {self.split!r})")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"--heldout-fraction must be in (0, 1) (got {self.heldout_fraction})")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"--workers must be between 1 and 256 (got {self.workers})")
        if self.reflection and self.mode == "oracle":
            raise ConfigError(
                "--reflection applies to sampled trajectories (--mode free or referenced); "
                "the oracle replays a walk and samples nothing"
            )
        if self.fan_out < 1:
            raise ConfigError(f"--fan-out must be >= 1 (got {self.fan_out})")
        if self.stratify not in STRATA:
            raise ConfigError(
                f"--stratify must be one of {', '.join(STRATA)} (got {self.stratify!r})"
            )
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1 (got {self.limit})")

    def tool_config(self) -> ToolConfig:
        # the same mapping as EvalConfig's until both nest the shared AgentConfig
        return ToolConfig(
            toolset=self.toolset,  # type: ignore[arg-type]
            top_k_relations=self.top_k_relations,
            max_triples_per_relation=self.max_triples,
            rerank=self.rerank,  # type: ignore[arg-type]
            relation_ranking=self.relation_ranking,  # type: ignore[arg-type]
        )
