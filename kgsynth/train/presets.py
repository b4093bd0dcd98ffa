"""The seed papers' RL recipes as ``kgsynth train rl --preset NAME``.

A preset fills :class:`~kgsynth.train.grpo.GRPOConfig` fields before the config file and the
flags (which both win over it), and the recipe (``default``/``tiny``) fills what is still
unset. Every value is the paper's *text*: each carries a :class:`Cite` (the paper's file in
the shared papers folder, the section or appendix as the text heads it, the quoted words) and
``tests/test_presets.py`` finds each quote at its place and checks the value against it.
Where the text states nothing the value is kgsynth's, marked "not stated" with the reason;
where the authors' released code differs from the text, the code's value is a ``note`` (a
variant you pass as flags), never the preset's. :func:`preset_table` renders all of it as
the table in docs/recipes.md, and a test pins that page to it.

Values are the papers' full-scale ones (a 3B-8B model on GPUs: learning rates near 1e-6,
groups of 5-16). On a CPU with the tiny model, pass ``--lr``, ``--group-size`` and
``--questions-per-step`` as well: the preset keeps its rewards, advantage and curriculum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kgsynth.core.errors import ConfigError


@dataclass(frozen=True)
class Cite:
    """Where a paper's text gives a value: the file under the shared papers folder
    (``graphwalker.txt``), the place as the text heads it (its section or appendix heading),
    the text's own words there (``quotes``, verbatim, garbled maths and all), and, where the
    value is not one of the quoted figures itself, how it follows from them (``reading``,
    arithmetic over them: ``512 / 8``). ``tests/test_presets.py`` reads each quote at its
    place in the paper and checks the value against the quoted figures."""

    paper: str
    place: str
    quotes: tuple[str, ...]
    reading: str = ""

    def cell(self) -> str:
        quoted = "; ".join("`" + q.replace("|", "\\|") + "`" for q in self.quotes)
        then = f" → {self.reading}" if self.reading else ""
        return f"{self.paper}, {self.place}: {quoted}{then}"


@dataclass(frozen=True)
class Setting:
    """One preset value: the paper's text for it (``cite``), or ``None`` where the text states
    none and kgsynth's value is used, ``why`` saying so; ``note``: a departure, or the
    authors' code's value where it differs from the text (a variant, never the preset's)."""

    value: Any
    cite: Cite | None
    why: str = ""
    note: str = ""

    @property
    def source(self) -> str:
        if self.cite is None:
            return f"not stated: {self.why}"
        return self.cite.cell() + (f" ({self.why})" if self.why else "")


def _at(paper: str, place: str, *quotes: str, reading: str = "") -> Cite:
    return Cite(paper, place, tuple(quotes), reading)


def _unstated(value: Any, why: str, note: str = "") -> Setting:
    return Setting(value, None, why, note)


GW, KBQA, KC, KGR1, ISP = (
    "graphwalker.txt", "kbqa-r1.txt", "knowcoder-a1.txt", "kg-r1.txt", "isp-kgr.txt"
)  # fmt: skip
GW_RL = "2.3 GraphWalker Training"
GW_G = "Appendix G Training Implementation Details"  # its Table 12
KBQA_SETUP = "V-A4 Training Setup"
KBQA_GRPO = "IV-C2 Policy Optimization (GRPO)"
KC_GRPO = "4.3.1 Policy Optimization via GRPO"
KC_A4 = "A.4 Implementation Details"  # its parameter table
KGR1_RL = "3.3 KG-R1 TRAINING WITH RL"
KGR1_D4 = "D.4 RL IMPLEMENTATION & HYPERPARAMETER"
ISP_C = "C Experiments"
ISP_G1 = "G.1 Policy Optimization"
ISP_DTPO = "4.3.2 Distance-guided Dense Reward Design for Reasoning"
ONE_PASS = (
    "one pass over each step's rollouts, as the single-update GRPO of the papers that state it"
)
TOKEN_MEAN = "kgsynth's token-mean"

RL_PRESETS: dict[str, dict[str, Setting]] = {
    "graphwalker": {
        "reward": Setting(
            "graphwalker",
            _at(GW, GW_RL, "sparse, trajectory-level exact match reward"),
            "Eq. 3: R = EM, i.e. `hit`",
        ),
        "scale_rewards": Setting(True, _at(GW, GW_RL, "the group-normalized advantage")),
        "turn_advantage": Setting(False, _at(GW, GW_RL, "trajectory-level exact match reward")),
        "toolset": Setting(
            "graphwalker", _at(GW, "2.1 Agentic Initialization", "two primitive tools")
        ),
        "top_k_relations": Setting(
            20,
            _at(
                GW,
                "E.1 Ablation of LLM-based Relation Reranking",
                "we adopt Top-20 as the default threshold",
            ),
            note="the authors' script keeps 10 (kg_top_k=10): --top-k-relations 10",
        ),
        "kl_coef": Setting(0.001, _at(GW, GW_G, "KL Loss Coefficient 0.001")),
        "clip_low": _unstated(0.2, "Eq. 4 clips at 1 ± ε and gives no ε; kgsynth's 0.2"),
        "clip_high": _unstated(
            0.2,
            "Eq. 4 clips symmetrically (1 ± ε), so clip_high = clip_low",
            "the authors' script sets eps-clip-high 0.28 (DAPO): --clip-high 0.28",
        ),
        "group_size": Setting(8, _at(GW, GW_G, "Rollout N 8")),
        "questions_per_step": Setting(
            64,
            _at(GW, GW_G, "Rollout Batch Size 64"),
            note="the authors' script rolls out 16 questions a step (rollout-batch-size 16)",
        ),
        "ppo_mini_batch": Setting(
            64,
            _at(GW, GW_G, "Global-batch Size 512", "Rollout N 8", reading="512 / 8"),
            "one global batch of 512 rollouts = the step's 64 questions: one optimizer step",
        ),
        "ppo_epochs": _unstated(
            1,
            ONE_PASS,
            "the authors' script takes 2 updates per rollout batch (num-steps-per-rollout 2): "
            "--ppo-epochs 2",
        ),
        "loss_agg": Setting(
            "seq-mean-token-mean",
            _at(GW, GW_RL, r"\frac{1}{N}\sum_{i=1}^{N}\frac{1}{|\tau^{(i)}|}"),
            "Eq. 4: each trajectory's tokens averaged, then the N trajectories",
        ),
        "max_turns": Setting(10, _at(GW, "3.1 Experimental Setup", "max turn number T=10")),
        "max_turn_tokens": _unstated(
            512,
            "Table 12's Max Response Length 8192 bounds a whole trajectory, not a turn; "
            "kgsynth's default recipe's 512 per turn (the authors' script's too)",
        ),
        "temperature": Setting(1.0, _at(GW, GW_G, "Rollout Temperature 1.0")),
        "lr": Setting(1e-6, _at(GW, GW_G, "Learning Rate 1e-6")),
        "warmup_ratio": _unstated(0.0, "the text names no warm-up; kgsynth's none"),
        "max_steps": Setting(100, _at(GW, GW_G, "Steps 100")),
    },
    "kbqa-r1": {
        "reward": Setting(
            "kbqa-r1",
            _at(KBQA, "IV-C1 Reward Formulation", r"\mathbb{I}[r_{\text{outcome}}>0]"),
            "Eq. 2: 1.0 F1 + 0.1 format, the format term only when F1 > 0 (V-A4's weights)",
        ),
        "scale_rewards": Setting(
            False,
            _at(KBQA, KBQA_GRPO, r"\hat{A}_{i}=r_{i}-\frac{1}{n}\sum_{j=1}^{n}r_{j}"),
            "Eq. 4: r - mean(r), no std",
        ),
        "turn_advantage": Setting(
            False, _at(KBQA, KBQA_GRPO, "their corresponding scalar rewards")
        ),
        "toolset": Setting(
            "sexpr",
            _at(KBQA, "IV-A2 Action Space", "Find_relation"),
            "the S-expression actions, executed on the KG",
        ),
        "gate_high": Setting(0.95, _at(KBQA, KBQA_SETUP, r"\tau_{\text{high}}=0.95")),
        "gate_low": Setting(0.3, _at(KBQA, KBQA_SETUP, r"\tau_{\text{low}}=0.3")),
        "kl_coef": Setting(0.001, _at(KBQA, KBQA_SETUP, "KL loss coefficient β=0.001")),
        "clip_low": Setting(0.2, _at(KBQA, KBQA_SETUP, r"\epsilon_{\text{low}}=0.2")),
        "clip_high": Setting(0.28, _at(KBQA, KBQA_SETUP, r"\epsilon_{\text{high}}=0.28")),
        "group_size": Setting(5, _at(KBQA, KBQA_SETUP, "responses per prompt", "n=5")),
        "questions_per_step": Setting(256, _at(KBQA, KBQA_SETUP, "train batch size 256")),
        "ppo_mini_batch": Setting(
            128, _at(KBQA, KBQA_SETUP, "PPO mini-batch size 128"), "2 optimizer steps a step"
        ),
        "ppo_epochs": _unstated(1, ONE_PASS),
        "loss_agg": Setting(
            "token-mean",
            _at(KBQA, KBQA_GRPO, r"\mathbb{E}_{s_{t},a_{t}\sim\pi_{\theta}}"),
            "Eq. 3: an expectation over the sampled tokens",
        ),
        "temperature": Setting(1.0, _at(KBQA, KBQA_SETUP, r"temperature τ=1.0")),
        "top_p": Setting(0.99, _at(KBQA, KBQA_SETUP, "top-p=0.99")),
        "lr": Setting(1e-6, _at(KBQA, KBQA_SETUP, "actor learning rate", r"1\times 10^{-6}")),
        "warmup_ratio": Setting(0.3, _at(KBQA, KBQA_SETUP, "30% linear warmup")),
    },
    "knowcoder-a1": {
        "reward": Setting(
            "knowcoder-a1",
            _at(KC, "4.3.2 Reward and Curriculum strategy", "capped at a maximum value of 1.0"),
            "format + F-beta answer reward",
        ),
        "fbeta_switch_reward": _unstated(
            0.5,
            "Phase 2 starts once the model achieves stable precision, with no number; kgsynth "
            "switches when the outcome reward's running mean reaches 0.5 (--fbeta-switch-step "
            "N switches at a step instead)",
        ),
        "scale_rewards": Setting(True, _at(KC, KC_GRPO, "normalized by the standard deviation")),
        "turn_advantage": Setting(
            False, _at(KC, KC_GRPO, "derived solely from the final outcome of the trajectory")
        ),
        "toolset": Setting(
            "knowcoder", _at(KC, "4.1 Agentic Initialization", "SearchTypes(typename)")
        ),
        "group_size": Setting(8, _at(KC, KC_A4, "Rollout N | 8")),
        "questions_per_step": Setting(64, _at(KC, KC_A4, "Rollout Batch Size | 64")),
        "ppo_mini_batch": Setting(
            64,
            _at(KC, KC_A4, "Global-batch Size | 512", "Rollout N | 8", reading="512 / 8"),
            "the whole rollout batch in one optimizer step",
        ),
        "ppo_epochs": Setting(
            1,
            _at(KC, KC_GRPO, "a single SGD step to the entire rollout batch"),
            "on-policy: the importance ratio is 1",
        ),
        "max_turns": _unstated(
            10,
            "the text gives no turn limit; kgsynth's default",
            "a third-party reading of the authors' code also finds 10 in training (unverified)",
        ),
        "kl_coef": Setting(0.001, _at(KC, KC_A4, "KL Loss Coefficient | 0.001")),
        "clip_low": _unstated(
            0.2, "the ratio is 1 in a single on-policy step, so the clip never acts; kgsynth's"
        ),
        "clip_high": _unstated(0.28, "as clip_low; kgsynth's"),
        "loss_agg": _unstated(
            "token-mean", f"Eq. 6-8 did not survive in the text's copy; {TOKEN_MEAN}"
        ),
        "temperature": Setting(1.0, _at(KC, KC_A4, "Rollout Temperature | 1.0")),
        "lr": Setting(1e-6, _at(KC, KC_A4, "| Learning Rate | 1e-6 |")),
        "warmup_ratio": Setting(
            0.0, _at(KC, KC_A4, "Learning Rate Warmup Steps | -1(disabled)", reading="0")
        ),
    },
    "kg-r1": {
        "reward": Setting(
            "kg-r1",
            _at(KGR1, "D.3 REWARD WEIGHTS", "Final-answer weight", "Retrieval-coverage weight"),
            "Table 8: global 1.0 F1 + 1.0 retrieval; per turn 0.5 format + 0.5 KG query + 0.5 "
            "answer format",
            "the per-turn answer bonus is folded into query validity (an answer turn counts as "
            "a valid action); the released script weighs the global terms 0.5 / 0.5",
        ),
        "turn_advantage": Setting(
            True,
            _at(
                KGR1, KGR1_RL, r"G_t^{(n)} = r_t^{\text{turn},(n)} + \lambda R^{\text{global},(n)}"
            ),
            "Eq. 3, one baseline pooled over the group's turns",
        ),
        "turn_lambda": _unstated(
            1.0,
            "Eq. 3's lambda has no value in the text; kgsynth's 1",
            "the released code instead adds 0.5 x the turn advantage to the global one",
        ),
        "scale_rewards": Setting(True, _at(KGR1, KGR1_RL, r"\sigma_G + \varepsilon")),
        "toolset": Setting("kgr1", _at(KGR1, "3.2 KG-R1 FRAMEWORK", "get_tail_relations")),
        "kl_coef": Setting(0.01, _at(KGR1, KGR1_D4, r"$\beta = 0.01$ for 3B")),
        "clip_low": _unstated(0.2, "the objective clips at 1 ± ε and gives no ε; kgsynth's 0.2"),
        "clip_high": _unstated(0.2, "the objective clips symmetrically, so clip_high = clip_low"),
        "group_size": Setting(
            16, _at(KGR1, KGR1_D4, "$N = 16$ trajectories per prompt for the 3B model")
        ),
        "questions_per_step": Setting(128, _at(KGR1, KGR1_D4, "training batch size of 128")),
        "ppo_mini_batch": Setting(128, _at(KGR1, KGR1_D4, "The mini-batch size is 128")),
        "ppo_epochs": _unstated(1, ONE_PASS),
        "loss_agg": _unstated(
            "token-mean",
            "the objective sums over every turn's tokens with no normaliser; "
            f"{TOKEN_MEAN} is its per-batch mean",
        ),
        "max_turns": Setting(
            5,
            _at(KGR1, "4.1 PERFORMANCE AND EFFICIENCY ON TRAINED KGs", "we set $H = 5$ turns"),
            note="the released script uses 7",
        ),
        "max_obs_tokens": _unstated(512, "kgsynth's default (the released script's too)"),
        "temperature": Setting(1.0, _at(KGR1, KGR1_D4, "sampling temperature 1.0")),
        "top_p": Setting(1.0, _at(KGR1, KGR1_D4, "`top_p= 1.0`")),
        "lr": Setting(1e-6, _at(KGR1, KGR1_D4, "identical learning rate of 1×10^{-6}")),
        "weight_decay": Setting(0.01, _at(KGR1, KGR1_D4, "weight decay 0.01")),
        "max_grad_norm": Setting(1.0, _at(KGR1, KGR1_D4, "global norm set to 1.0")),
        "warmup_ratio": Setting(0.0, _at(KGR1, KGR1_D4, "with no warmup", reading="0")),
        "max_steps": Setting(400, _at(KGR1, KGR1_D4, "Training runs for 400 steps")),
    },
    "isp": {
        "reward": Setting(
            "format:0.1,distance:0.6,f1:0.3",
            _at(ISP, "5.1 Experimental Setup", "$w_1 = 0.1$, $w_2 = 0.6$, and $w_3 = 0.3$"),
            "w1 format, w2 progress (kgsynth's distance reward), w3 outcome F1 (§4.3.2); on a "
            "tree, per node: the step's format and progress plus the best outcome among its "
            "subtree's leaves",
            "the authors' code gives outcome the 0.6 and progress the 0.3: --reward isp (the "
            "reward preset); with --rollout flat, format is kgsynth's 0/1 per episode",
        ),
        "rollout": Setting(
            "tree",
            _at(ISP, "4.3.1 Tree-based Rollout and Pruning", "tree-structured rollout strategy"),
            "every parent's kept children are one GRPO group (step-level GRPO)",
            "a child's group is its kept siblings as they are; the code pads or thins each "
            "group to exactly 6",
        ),
        "branches": Setting(16, _at(ISP, ISP_C, "$K = 16$")),
        "group_size": Setting(
            16,
            _at(ISP, ISP_C, "The branching factor is set to $K = 16$"),
            "§4.3.2: the k sampled branches are the comparison group; --rollout flat only",
            "the authors' code samples 6 per prompt (n-samples-per-prompt 6)",
        ),
        "max_tree_nodes": _unstated(
            16,
            "the text bounds a tree only by pruning equivalent branches; kgsynth caps the live "
            "nodes per question so a run's cost is bounded",
        ),
        "tree_prune": Setting(
            "tree",
            _at(
                ISP,
                "F.5 Environment-Feedback-Based Pruning",
                "we retain only one representative branch for each unique result",
            ),
            "one cache of results per question tree; failed branches kept (App. F.3, Alg. 1)",
            "--tree-prune siblings is kgsynth's earlier rule (one parent's children only)",
        ),
        "progress_rule": Setting(
            "previous",
            _at(ISP, ISP_G1, r"s_{\text{prev}} \leftarrow s_{\text{curr}}"),
            "Alg. 2 (printed under G.1): each step's progress against the step before",
            "--progress-rule best is kgsynth's earlier rule",
        ),
        "question_curriculum": Setting(
            "difficulty",
            _at(ISP, "5.1 Experimental Setup", "introduced sequentially during training"),
            "easy, medium, then hard questions (App. E.1)",
        ),
        "tree_value": Setting(
            "max", _at(ISP, ISP_DTPO, "We adopt a max-reward aggregation strategy")
        ),
        "turn_advantage": Setting(
            True,
            _at(ISP, ISP_DTPO, "fine-grained credit assignment"),
            "for --rollout flat only: each step's progress reaches its own tokens through the "
            "pooled turn advantage (tree rollouts are step-level by construction)",
        ),
        "turn_lambda": _unstated(1.0, "flat rollouts only; kgsynth's 1"),
        "scale_rewards": Setting(
            True, _at(ISP, ISP_G1, r"\text{std}(\{r_k^{(j)}\}_{j=1}^G) + \delta")
        ),
        "toolset": Setting(
            "isp",
            _at(
                ISP, "4.1 Interactive Semantic Parsing Framework", "`<node>` for relation expansion"
            ),
        ),
        "kl_coef": Setting(0.0, _at(ISP, ISP_C, "we do not utilize KL divergence", reading="0")),
        "clip_low": Setting(0.2, _at(ISP, ISP_C, "clipping coefficient to 0.2")),
        "clip_high": Setting(
            0.2,
            _at(ISP, ISP_C, "clipping coefficient to 0.2"),
            "one coefficient: 1 ± ε (G.1)",
            "the authors' code sets clip-higher 0.24: --clip-high 0.24",
        ),
        "questions_per_step": Setting(
            64,
            _at(ISP, ISP_C, "The batch size is configured at 64"),
            note="the authors' code rolls out 128 questions a step",
        ),
        "ppo_mini_batch": Setting(
            128,
            _at(ISP, ISP_C, "the mini-batch size is set to 128"),
            "at or above the batch of 64: one optimizer step a step",
            "the text does not say what the 128 counts; read as sampled sequences it would be "
            "several steps a batch. The authors' code takes 4 (global batch 32 of 128)",
        ),
        "ppo_epochs": _unstated(1, ONE_PASS),
        "loss_agg": Setting(
            "seq-mean-token-mean",
            _at(ISP, ISP_G1, r"\frac{1}{|A_k^{(i)}|} \sum_{m=1}^{|A_k^{(i)}|}"),
            "each action's tokens averaged, then the G actions",
        ),
        "max_turns": _unstated(
            6,
            "the text gives no step limit; the authors' code's 6 interactions",
            "",
        ),
        "temperature": Setting(1.0, _at(ISP, ISP_C, "sampling temperature to 1.0")),
        "top_p": Setting(1.0, _at(ISP, ISP_C, r"\text{top-}p = 1")),
        "lr": Setting(
            1e-6,
            _at(ISP, ISP_C, "fixed at 1×10^{-6} without a warm-up phase"),
            note="the authors' code uses 5e-7",
        ),
        "warmup_ratio": Setting(0.0, _at(ISP, ISP_C, "without a warm-up phase", reading="0")),
        "max_steps": Setting(168, _at(ISP, ISP_C, "168 update steps")),
    },
}


# Agent settings of a paper's environment that rl has no option for (they are the tool set's,
# see kgsynth.agent.config): the run takes them from what --init carries, and where it carries
# none (a base model, as KG-R1 starts from), from its preset.
RL_PRESET_AGENT: dict[str, dict[str, Setting]] = {
    "graphwalker": {
        "graphwalker_observations": Setting(
            "paper",
            _at(GW, "Appendix H Prompts", "We will automatically use the top 4"),
            "App. E.3 and H: relations as one list, triples as [h, r, t], the top 4 relations "
            "of a get_triples call followed",
        ),
    },
    "kg-r1": {
        "kgr1_subgraph_hops": Setting(
            2,
            _at(
                KGR1,
                "4.1 PERFORMANCE AND EFFICIENCY ON TRAINED KGs",
                "we extract 2-hop subgraphs for each question",
            ),
            "the tools answer from the question's 2-hop subgraph",
        ),
    },
}


def preset_agent_values(name: str | None) -> dict[str, Any]:
    """The agent settings preset ``name`` gives a run whose --init carries none of them."""
    if not name:
        return {}
    preset_values(name)  # an unknown name fails here
    return {k: s.value for k, s in RL_PRESET_AGENT.get(name.strip().lower(), {}).items()}


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
    """docs/recipes.md's table: one row per preset and field, its citation into the paper's
    text (or why the text states none) and any departure or code variant."""
    from kgsynth.agent.rewards import PRESETS

    lines = [
        "| preset | field | value | the paper's text | departure, code variant |",
        "|---|---|---|---|---|",
    ]
    for name, settings in RL_PRESETS.items():
        for field, s in {**settings, **RL_PRESET_AGENT.get(name, {})}.items():
            value = _cell(s.value)
            if field == "reward" and s.value in PRESETS:
                weights = ", ".join(f"{n}:{w:g}" for n, w in PRESETS[s.value]["weights"])
                value = f"`{s.value}` = {weights}"
            lines.append(f"| {name} | {field} | {value} | {s.source} | {s.note} |")
    return "\n".join(lines)
