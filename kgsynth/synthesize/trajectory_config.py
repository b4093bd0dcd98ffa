"""The options of ``kgsynth synthesize trajectories`` (:class:`TrajectoryConfig`): one flag per
field, named as the field, with its help and its checks here."""

from __future__ import annotations

from dataclasses import dataclass, field

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.tools import ToolConfig
from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError

MODES = ("oracle", "referenced", "free", "coldstart")
STRATA = ("none", "structure", "hops")
REFERENCE_GUIDANCE = ("per_step", "whole")
SPLITS = ("all", "train", "heldout")


@dataclass(frozen=True)
class TrajectoryConfig:
    """Options of ``kgsynth synthesize trajectories``."""

    mode: str = option(
        "oracle",
        "oracle (replayed walks + thoughts), referenced (policy sees the gold actions), free, "
        "or coldstart (knowcoder: KnowCoder-A1 §4.2.1, an LLM sampled with hand-written "
        "trial-and-error demos, kept by hit + grounding; --llm template: the scripted oracle "
        "with --trial-and-error instead, kgsynth.synthesize.coldstart).",
    )
    samples: int = option(1, "Episodes per question (free/referenced).")
    temperature: float = option(0.7, "Policy temperature.")
    # the agent's settings (tool set, turn limit, tokens per turn, what the tools show, system
    # prompt), shared with eval and RL; given and read under their own names
    agent: AgentConfig = field(default_factory=AgentConfig)
    seed: int = option(0, "Sampling seed (sample i uses seed + i).")
    # the stored trajectory keeps the plain prompt; the reflection text only shapes the sample
    reflection: bool = option(
        False,
        "free/referenced: sample with reflection instructions added to the system prompt "
        "(GraphRoll-style: notice a failed step, go back, check the answer before giving it; "
        "prompts/reflection.j2); the stored trajectories keep the plain prompt.",
        advanced=True,
    )
    correct_names: bool = option(
        False,
        "free/referenced with --entity-matching near: store a name the environment read as "
        "another as the name it was read as (the call, the reasoning that repeats it, the "
        "turn's record), without the observation's note, so an accepted rollout teaches the "
        "KG's name (hindsight correction); answers stay as written.",
        advanced=True,
    )
    workers: int = option(
        1,
        "N processes, with the same output as one: oracle with --llm template replays the "
        "questions over contiguous shards (each opens the KG itself); --llm hf on CPU "
        "generates the policy's batches in N processes.",
        panel="Launch",
        advanced=True,
    )
    fan_out: int = option(
        1,
        "oracle: follow a chain's next hop from up to this many of the entities the hop before "
        "reached, so the replay observes the whole answer set.",
        advanced=True,
    )
    follow: str = option(
        "walked",
        "oracle on chains: walked goes on from the entity the walk passed through (or, when the "
        "display cap hides it, the first shown one the next hop leads on from); first always "
        "goes on from the first shown one, so which entity the agent follows is a rule it can "
        "read from the observation.",
        advanced=True,
    )
    look_ahead: bool = option(
        False,
        "oracle with --toolset graphwalker: after the last hop, list the relations of the first "
        "answer shown before answering, so every hop ends with the relations of an entity it "
        "reached and the agent decides to go on or answer with that list, ranked by the "
        "question, in its context.",
        advanced=True,
    )
    trial_and_error: float = option(
        0.0,
        "oracle: the share of questions (drawn per question with --seed) that also get a "
        "trial-and-error trajectory (mode oracle_trial): knowcoder, a first ExecuteSPARQL with "
        "a relation the wrong way round or a wrong relation the SearchGraphPatterns observation "
        "showed, its empty or wrong rows, then the gold query; sexpr, a Find_relation along a "
        "relation the episode's observations listed that the relation gate rejects or "
        "substitutes wrongly, then the gold action; graphwalker and kgr1, at one inner hop of a "
        "chain the relations of the entities shown before the one the replay goes on from, "
        "each without the next hop's relation (dead ends), then the replay; 0 writes none.",
        advanced=True,
    )
    reference_guidance: str = option(
        "per_step",
        "referenced: how the policy is shown the gold actions: per_step (KBQA-R1 §IV-B1 step 2: "
        "each turn, the next gold action after those the episode has made) or whole (the "
        "numbered sequence once, in the user prompt; kgsynth's earlier variant). Either way "
        "the stored prompts hold no reference (§IV-B1 step 4).",
        advanced=True,
    )
    reference_share: float = option(
        0.0,
        "oracle: the share of questions (drawn per question with --seed) whose stored user "
        "prompt also shows the gold action sequence, as --mode referenced shows it, so a policy "
        "trained from scratch learns to read a reference before Referenced Rejection Sampling "
        "(a pretrained LLM reads one without); 0 keeps every prompt plain, as KBQA-R1 §IV-B1 "
        "step 4 strips every reference from the SFT data.",
        advanced=True,
    )
    stratify: str = option(
        "none",
        "With --limit: draw the K questions stratified by structure or hops (equal shares, "
        "seeded; GraphRoll's sampling for expert rollouts) instead of the first K; none takes "
        "the first K.",
        panel="Inputs",
        advanced=True,
    )
    split: str = option(
        "all",
        "all, train or heldout: a stable split by question_id hash, so stage 1 and the stage-2 "
        "rollouts can use disjoint questions.",
        panel="Inputs",
        advanced=True,
    )
    heldout_fraction: float = option(
        0.1, "Share of questions in the heldout split.", panel="Inputs", advanced=True
    )
    limit: int | None = option(None, "Use only the first K questions.", panel="Inputs")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if self.samples < 1:
            raise ConfigError(f"--samples must be >= 1 (got {self.samples})")
        if self.split not in SPLITS:
            raise ConfigError(f"--split must be all, train or heldout (got {self.split!r})")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"--heldout-fraction must be in (0, 1) (got {self.heldout_fraction})")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"--workers must be between 1 and 256 (got {self.workers})")
        self.agent.check_turn_tokens()
        if self.reflection and self.mode == "oracle":
            raise ConfigError(
                "--reflection applies to sampled trajectories (--mode free or referenced); "
                "the oracle replays a walk and samples nothing"
            )
        if not 0.0 <= self.trial_and_error <= 1.0:
            raise ConfigError(
                f"--trial-and-error must be within [0, 1] (got {self.trial_and_error})"
            )
        if self.mode == "coldstart" and not space(self.agent.toolset).cold_start:
            raise ConfigError(
                "--mode coldstart is KnowCoder-A1's cold start: it needs --toolset knowcoder "
                f"(got --toolset {self.agent.toolset})"
            )
        if self.trial_and_error > 0 and (
            self.mode not in ("oracle", "coldstart")
            or not space(self.agent.toolset).trial_and_error
        ):
            raise ConfigError(
                "--trial-and-error writes trial-and-error demonstrations: it needs --mode oracle "
                "and --toolset knowcoder, sexpr, graphwalker or kgr1 "
                f"(got --mode {self.mode}, --toolset {self.agent.toolset})"
            )
        if self.reference_guidance not in REFERENCE_GUIDANCE:
            raise ConfigError(
                f"--reference-guidance must be per_step or whole (got {self.reference_guidance!r})"
            )
        if not 0.0 <= self.reference_share <= 1.0:
            raise ConfigError(
                f"--reference-share must be within [0, 1] (got {self.reference_share})"
            )
        if self.reference_share > 0 and self.mode != "oracle":
            raise ConfigError(
                "--reference-share shows references in oracle trajectories: it needs --mode "
                f"oracle (got --mode {self.mode})"
            )
        if self.correct_names and (self.mode == "oracle" or self.agent.entity_matching != "near"):
            raise ConfigError(
                "--correct-names corrects the names a sampled rollout's calls got read as: it "
                f"needs --mode free or referenced and --entity-matching near (got --mode "
                f"{self.mode}, --entity-matching {self.agent.entity_matching})"
            )
        if self.follow not in ("walked", "first"):
            raise ConfigError(f"--follow must be walked or first (got {self.follow!r})")
        if self.look_ahead and (self.mode != "oracle" or not space(self.agent.toolset).look_ahead):
            raise ConfigError(
                "--look-ahead changes the graphwalker oracle's replays: it needs --mode oracle "
                f"and --toolset graphwalker (got --mode {self.mode}, --toolset {self.agent.toolset})"
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
        """What the KG tools show (the agent's settings)."""
        return self.agent
