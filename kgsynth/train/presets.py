"""The seed papers' RL recipes as ``kgsynth train rl --preset NAME``.

A preset fills :class:`~kgsynth.train.grpo.GRPOConfig` fields before the config file and the
flags (which both win over it), and the recipe (``default``/``tiny``) fills what is still
unset. Each value carries where it comes from: a paper section or table, the authors' released
training script, or ``kgsynth`` where the paper states nothing and kgsynth's own default is
used. :func:`preset_table` renders all of them as the table in docs/recipes.md, and a test
pins that page to it, so the table and the code cannot drift apart.

Values are the papers' full-scale ones (a 3B-7B model on GPUs: learning rates near 1e-6,
groups of 8-16). On a CPU with the tiny model, pass ``--lr``, ``--group-size`` and
``--questions-per-step`` as well: the preset keeps its rewards, advantage and curriculum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kgsynth.core.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """One preset value and where it comes from (``note``: why kgsynth departs, if it does)."""

    value: Any
    source: str
    note: str = ""


KGSYNTH = "not stated; kgsynth's default"
GW = "GraphWalker code, run_qwen2.5_3B_it.sh"
KBQA = "KBQA-R1 v1 §V-A4"
KGR1 = "KG-R1 v2 App. D"
KGR1_SH = "KG-R1 code, train_grpo_kg_qwen_3b_cwq_f1_turn7.sh"
ISP = "ISP-KGR code, run_kg_grpo.sh"
ISP_REWARD = "ISP-KGR code, reward_fn.py"
ISP_ROLLOUT = "ISP-KGR code, rollout_fn.py"

RL_PRESETS: dict[str, dict[str, Setting]] = {
    "graphwalker": {
        "reward": Setting("graphwalker", "GraphWalker §3.3 and code: trajectory EM, i.e. `hit`"),
        "scale_rewards": Setting(True, f"{GW}: GRPO advantage (group mean and std)"),
        "turn_advantage": Setting(False, f"{GW}: one trajectory-level reward"),
        "toolset": Setting("graphwalker", "GraphWalker §3.1"),
        "top_k_relations": Setting(10, "GraphWalker code: kg_top_k=10"),
        "kl_coef": Setting(0.001, f"{GW}: low-variance KL loss 0.001"),
        "clip_low": Setting(0.2, f"{GW}: eps-clip 0.2"),
        "clip_high": Setting(0.28, f"{GW}: eps-clip-high 0.28"),
        "group_size": Setting(8, f"{GW}: n-samples-per-prompt 8"),
        "questions_per_step": Setting(16, f"{GW}: rollout-batch-size 16"),
        "updates_per_step": Setting(2, f"{GW}: num-steps-per-rollout 2"),
        "max_turns": Setting(10, "GraphWalker code: max_calls=10"),
        "max_turn_tokens": Setting(512, f"{GW}: rollout-max-response-len 512"),
        "temperature": Setting(1.0, f"{GW}: rollout temperature 1"),
        "lr": Setting(1e-6, f"{GW}: lr 1e-6, constant"),
        "warmup_ratio": Setting(0.0, f"{GW}: constant schedule, no warm-up"),
    },
    "kbqa-r1": {
        "reward": Setting(
            "kbqa-r1", f"{KBQA}, Eq. 2: 1.0 F1 + 0.1 format, the format term only when F1 > 0"
        ),
        "scale_rewards": Setting(False, "KBQA-R1 §IV-C2, Eq. 4: advantage r - mean(r), no std"),
        "turn_advantage": Setting(False, "KBQA-R1 §IV-C2: one trajectory-level reward"),
        "toolset": Setting(
            "sexpr",
            "KBQA-R1's action space: Find_relation, Merge, Order, Compare, Time_constraint, "
            "Count, building an S-expression executed on the KG",
        ),
        "gate_high": Setting(
            0.95, "KBQA-R1's RRCG: tau_high 0.95 (a relation this similar is used)"
        ),
        "gate_low": Setting(0.3, "KBQA-R1's RRCG: tau_low 0.3 (below it a relation is not found)"),
        "kl_coef": Setting(0.001, f"{KBQA}: KL loss 0.001"),
        "clip_low": Setting(0.2, f"{KBQA}: clip 0.2"),
        "clip_high": Setting(0.28, f"{KBQA}: clip-higher 0.28"),
        "group_size": Setting(5, f"{KBQA}: n = 5"),
        "questions_per_step": Setting(256, f"{KBQA}: train batch 256"),
        "updates_per_step": Setting(2, f"{KBQA}: PPO mini-batch 128 of 256"),
        "temperature": Setting(1.0, f"{KBQA}: temperature 1.0"),
        "top_p": Setting(0.99, f"{KBQA}: top-p 0.99"),
        "lr": Setting(1e-6, f"{KBQA}: RL lr 1e-6"),
        "warmup_ratio": Setting(0.3, f"{KBQA}: 30 % linear warm-up"),
    },
    "knowcoder-a1": {
        "reward": Setting(
            "knowcoder-a1", "KnowCoder-A1 §4.3.2: outcome-only F-beta (+ format), capped at 1"
        ),
        "fbeta_switch_reward": Setting(
            0.5,
            "KnowCoder-A1 code README: F0.5 stages, then an F1 stage (easy to hard)",
            "the switch step is not stated; kgsynth switches when the outcome reward's running "
            "mean reaches 0.5 (--fbeta-switch-step N switches at a step instead)",
        ),
        "scale_rewards": Setting(True, KGSYNTH),
        "turn_advantage": Setting(False, "KnowCoder-A1: outcome-only supervision"),
        "toolset": Setting(
            "knowcoder", "KnowCoder-A1's tools: SearchTypes, SearchGraphPatterns, ExecuteSPARQL"
        ),
        "group_size": Setting(
            8, "third-party reading of the KnowCoder-A1 code (rollout repeat 8)", "not verified"
        ),
        "max_turns": Setting(
            10,
            "third-party reading of the KnowCoder-A1 code (10 turns in training)",
            "not verified",
        ),
        "updates_per_step": Setting(1, KGSYNTH),
        "kl_coef": Setting(0.001, KGSYNTH),
        "clip_low": Setting(0.2, KGSYNTH),
        "clip_high": Setting(0.28, KGSYNTH),
    },
    "kg-r1": {
        "reward": Setting(
            "kg-r1",
            f"{KGR1}, Eq. 1-2, Table 8: global 1.0 F1 + 1.0 retrieval; per turn 0.5 format + "
            "0.5 query validity",
            "the per-turn answer bonus (0.5) is folded into validity (an answer turn counts as a "
            "valid action); the released script weighs the global terms 0.5 / 0.5",
        ),
        "turn_advantage": Setting(
            True,
            f"{KGR1}, Eq. 3: G_t = r_t + lambda R, one baseline pooled over the group's turns",
        ),
        "turn_lambda": Setting(
            1.0,
            KGSYNTH,
            "the paper gives no number; the released code instead adds 0.5 x the turn advantage "
            "to the global one",
        ),
        "scale_rewards": Setting(True, f"{KGR1}; {KGR1_SH}: norm_adv_by_std_in_grpo=true"),
        "toolset": Setting("kgr1", "KG-R1 §3.2: the four one-hop actions, full sets"),
        "kl_coef": Setting(0.01, f"{KGR1}: k3 KL loss 0.01 (3B; 0.02 for 7B)"),
        "clip_low": Setting(0.2, "verl's default clip ratio (neither paper nor script sets one)"),
        "clip_high": Setting(0.2, "verl's default clip ratio (neither paper nor script sets one)"),
        "group_size": Setting(16, f"{KGR1}: N = 16 (3B; 8 for 7B)"),
        "questions_per_step": Setting(128, f"{KGR1}: batch 128 (3B; 256 for 7B)"),
        "updates_per_step": Setting(1, f"{KGR1}: mini-batch 128 = batch"),
        "max_turns": Setting(5, "KG-R1 §4.1: H = 5", "the released script uses 7"),
        "max_turn_tokens": Setting(256, f"{KGR1_SH}: max_response_length=256"),
        "max_obs_tokens": Setting(512, f"{KGR1_SH}: max_obs_length=512"),
        "temperature": Setting(1.0, f"{KGR1}: temperature 1.0"),
        "lr": Setting(1e-6, f"{KGR1}: AdamW lr 1e-6"),
        "weight_decay": Setting(0.01, f"{KGR1}: weight decay 0.01"),
        "max_grad_norm": Setting(1.0, f"{KGR1}: grad clip 1.0"),
        "warmup_ratio": Setting(0.0, f"{KGR1}: no warm-up"),
        "max_steps": Setting(400, f"{KGR1}: 400 steps"),
    },
    "isp": {
        "reward": Setting(
            "isp",
            f"{ISP_REWARD}: 0.1 format + 0.3 progress + 0.6 outcome F1; on a tree, per node: "
            "the step's format (+1/-1) and progress plus the best F1 among its subtree's leaves",
            "issues 15 and 17 quote 0.6 progress + 0.3 F1; the authors' code gives outcome the "
            "0.6. With --rollout flat, format is kgsynth's 0/1 per episode",
        ),
        "rollout": Setting(
            "tree",
            f"{ISP_ROLLOUT}: a k-beam tree per question; every parent's kept children are one "
            "GRPO group (step-level GRPO)",
            "a child's group is its kept siblings as they are; the code pads or thins each "
            "group to exactly 6 (n-samples-per-prompt)",
        ),
        "branches": Setting(16, f"{ISP_ROLLOUT}: 16 candidates per live node (KG_BEAM_CANDIDATES)"),
        "max_tree_nodes": Setting(
            16,
            KGSYNTH,
            "the code bounds a tree only by its 6 interactions and the pruning of equivalent "
            "branches; kgsynth caps the live nodes per question so a run's cost is bounded",
        ),
        "tree_value": Setting(
            "max", f"{ISP_REWARD}: a node's reward is the max over the trajectories through it"
        ),
        "turn_advantage": Setting(
            True,
            "ISP: per-step rewards",
            "applies to --rollout flat only (tree rollouts are step-level by construction): "
            "there each step's progress reaches its own tokens through the pooled turn advantage",
        ),
        "turn_lambda": Setting(1.0, KGSYNTH),
        "scale_rewards": Setting(True, f"{ISP}: group z-score"),
        "toolset": Setting(
            "isp",
            "ISP: node exploration (1- and 2-hop templates, top 10) and SPARQL execution, "
            "written as <node> and <SPARQL> operations, several per step, answers in \\boxed{}",
        ),
        "kl_coef": Setting(0.0, f"{ISP}: kl-coef 0"),
        "clip_low": Setting(0.2, f"{ISP}: clip 0.2"),
        "clip_high": Setting(0.24, f"{ISP}: clip-higher 0.24"),
        "group_size": Setting(6, f"{ISP}: n-samples-per-prompt 6 (from 16 beam candidates)"),
        "questions_per_step": Setting(128, f"{ISP}: rollout-batch-size 128"),
        "updates_per_step": Setting(4, f"{ISP}: global batch 32 of 128"),
        "max_turns": Setting(6, f"{ISP}: 6 interactions"),
        "max_turn_tokens": Setting(1024, f"{ISP}: 1,024 new tokens per step"),
        "temperature": Setting(1.0, f"{ISP}: temperature 1.0"),
        "lr": Setting(5e-7, f"{ISP}: lr 5e-7, constant"),
        "warmup_ratio": Setting(0.0, f"{ISP}: no warm-up"),
    },
}


def preset_values(name: str) -> dict[str, Any]:
    """The GRPOConfig fields preset ``name`` sets; ConfigError names the valid presets."""
    key = name.strip().lower()
    if key not in RL_PRESETS:
        raise ConfigError(f"--preset: unknown preset {name!r}; valid: {', '.join(RL_PRESETS)}")
    return {field: s.value for field, s in RL_PRESETS[key].items()}


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def preset_table() -> str:
    """docs/recipes.md's table: one row per preset and field, its source and any departure."""
    from kgsynth.agent.rewards import PRESETS

    lines = [
        "| preset | field | value | source | departure |",
        "|---|---|---|---|---|",
    ]
    for name, settings in RL_PRESETS.items():
        for field, s in settings.items():
            value = _cell(s.value)
            if field == "reward":
                weights = ", ".join(f"{n}:{w:g}" for n, w in PRESETS[s.value]["weights"])
                value = f"`{s.value}` = {weights}"
            lines.append(f"| {name} | {field} | {value} | {s.source} | {s.note} |")
    return "\n".join(lines)
