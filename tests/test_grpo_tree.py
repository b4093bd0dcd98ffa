"""Tree rollouts and step-level GRPO (ISP-KGR, issue 17): branching, pruning, failed leaves,
the composite reward per node, sibling advantages, the training rows, and one real
`kgsynth train rl --rollout tree` step on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kgsynth.agent.loop import Episode, EpisodeTask, TurnRecord  # noqa: E402
from kgsynth.agent.rewards import Gold, GraphDistance, RewardSpec  # noqa: E402
from kgsynth.agent.rewards.tree import score_tree  # noqa: E402
from kgsynth.agent.rollout import RolloutConfig, TokenPolicy, check_alignment  # noqa: E402
from kgsynth.agent.tools import ToolConfig, ToolEnvironment  # noqa: E402
from kgsynth.agent.tree import (  # noqa: E402
    ANSWERED,
    FAILED,
    TIMEOUT,
    branch_counts,
    run_tree_rollouts,
)
from kgsynth.kg.graph import KGGraph  # noqa: E402
from kgsynth.train.grpo_loss import token_logprobs  # noqa: E402
from kgsynth.train.grpo_tree import sibling_advantages, tree_sequences  # noqa: E402
from tests.kgfixtures import movie_kg, movie_ntriples  # noqa: E402

QUESTION = "who directed Kismet?"
GOLD = Gold(["William Dieterle"], QUESTION, ["Kismet"])
RELATIONS = '<think>a</think><kg-query>get_relations("Kismet")</kg-query>'
# the constructed tree: step 1 samples 3 branches from the root, two of them the same call
# (different thoughts, the same observation: pruned to one); step 2 samples 2 branches from
# each of the 2 live nodes (max_live 4): under the first, the same answer twice (pruned);
# under the second, the answer and a failed call (a tool error: a leaf, kept)
SCRIPT = [
    [
        RELATIONS,
        '<think>b</think><kg-query>get_relations("Kismet")</kg-query>',
        '<think>c</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>',
    ],
    [
        '<think>x</think><answer>["William Dieterle"]</answer>',
        '<think>y</think><answer>["william  dieterle"]</answer>',
        '<think>z</think><answer>["William Dieterle"]</answer>',
        '<think>w</think><kg-query>get_relations("No Such Film")</kg-query>',
    ],
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.kgfixtures import tiny_agent_model

    path = tiny_agent_model(tmp_path_factory.mktemp("tiny"), vocab_size=600)
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def scripted_sample(model, encode, script):
    """A sampler whose turns are the script's (one list per generate call, one text per
    sequence), with the real model's log-probs of those tokens."""
    calls = {"n": 0}

    def sample(batch, *, max_new_tokens, temperature, top_p):
        texts = script[min(calls["n"], len(script) - 1)]
        calls["n"] += 1
        out = []
        for i, ids in enumerate(batch):
            new = encode(texts[i % len(texts)])
            full = torch.tensor([list(ids) + new])
            with torch.no_grad():
                lp, _ = token_logprobs(model, full, torch.ones_like(full), temperature)
            out.append((new, lp[0, len(ids) :].tolist(), False))
        return out

    return sample


@pytest.fixture(scope="module")
def graph():
    return KGGraph(movie_kg())


@pytest.fixture(scope="module")
def built(tiny, graph):
    _, model, tok = tiny
    policy = TokenPolicy(model, tok)
    policy.sample = scripted_sample(model, policy.encode, SCRIPT)
    (tree,) = run_tree_rollouts(
        policy,
        [EpisodeTask(QUESTION, ["Kismet"])],
        lambda t: ToolEnvironment(graph, t.question, ToolConfig()),
        RolloutConfig(max_turns=2, max_turn_tokens=64, max_obs_tokens=64),
        branches=3,
        max_live=4,
    )
    return policy, tree


def test_branch_counts_keep_the_live_bound():
    assert branch_counts(1, 3, 8) == [3]
    assert branch_counts(2, 3, 4) == [2, 2]
    assert branch_counts(3, 3, 8) == [3, 3, 2]
    assert branch_counts(8, 3, 8) == [1] * 8
    for live in range(1, 9):
        assert 1 <= sum(branch_counts(live, 3, 8)) <= max(8, live)


def test_equivalent_branches_are_pruned_and_failed_ones_kept(built):
    _, tree = built
    assert [(s.live, s.sampled, s.pruned) for s in tree.steps] == [(1, 3, 1), (2, 4, 1)]
    assert tree.sampled == 7 and tree.pruned == 2
    assert tree.parents == [-1, 0, 0, 1, 2, 2]
    assert tree.leaves == [3, 4, 5]
    assert [tree.nodes[i].end for i in tree.leaves] == [ANSWERED, ANSWERED, FAILED]
    # the kept branch of the two same calls is the first sampled
    assert tree.nodes[1].episode.turns[-1].think == "a"
    assert tree.nodes[5].episode.turns[-1].tool_error == "entity_not_found"
    assert tree.generated_tokens == sum(s.tokens for s in tree.steps) > 0
    for i in tree.leaves:
        check_alignment(tree.nodes[i].rollout)
    # a child's path extends its parent's ids exactly, and its step is its own span
    for node in tree.nodes[1:]:
        parent = tree.nodes[node.parent].rollout
        s, e = node.span
        assert node.rollout.ids[:s] == parent.ids[:s]
        assert set(node.rollout.turn_of[s:e]) == {node.depth - 1}


def test_tree_past_its_wall_time_ends_its_live_branches_as_leaves(tiny, graph):
    _, model, tok = tiny
    policy = TokenPolicy(model, tok)
    policy.sample = scripted_sample(model, policy.encode, SCRIPT)
    (tree,) = run_tree_rollouts(
        policy,
        [EpisodeTask(QUESTION, ["Kismet"])],
        lambda t: ToolEnvironment(graph, t.question, ToolConfig()),
        RolloutConfig(max_turns=2, max_turn_tokens=64, timeout_s=1e-9),
        branches=3,
        max_live=4,
    )
    assert tree.timed_out and len(tree.steps) == 1 and tree.leaves == [1, 2]
    assert all(tree.nodes[i].end == TIMEOUT and tree.nodes[i].rollout.timed_out for i in (1, 2))


KISMET_DIRECTOR = (
    "SELECT ?x WHERE { <http://kgsynth.org/entity/Kismet> "
    "<http://kgsynth.org/relation/directed_by> ?x }"
)
KISMET_YEAR = KISMET_DIRECTOR.replace("directed_by", "release_year")


def test_tree_speaks_the_isp_action_format(tiny, graph):
    """The same tree on the isp tool set (<SPARQL> steps, \\boxed{} answers): the turn code is
    the tool set's, the branching and pruning the tree's."""
    _, model, tok = tiny
    policy = TokenPolicy(model, tok)
    policy.sample = scripted_sample(model, policy.encode, [
        [f"<think>a</think><SPARQL>{KISMET_DIRECTOR}</SPARQL>",
         f"<think>b</think><SPARQL>{KISMET_DIRECTOR}</SPARQL>",
         f"<think>c</think><SPARQL>{KISMET_YEAR}</SPARQL>"],
        ["<think>x</think>\\boxed{William Dieterle}", "<think>y</think>\\boxed{William Dieterle}",
         "<think>z</think>\\boxed{Bette Davis}", "no action at all"],
    ])  # fmt: skip
    (tree,) = run_tree_rollouts(
        policy,
        [EpisodeTask(QUESTION, ["Kismet"])],
        lambda t: ToolEnvironment(graph, t.question, ToolConfig(toolset="isp")),
        RolloutConfig(toolset="isp", max_turns=2, max_turn_tokens=64, max_obs_tokens=64),
        branches=3,
        max_live=4,
    )
    assert [(s.live, s.sampled, s.pruned) for s in tree.steps] == [(1, 3, 1), (2, 4, 1)]
    assert tree.parents == [-1, 0, 0, 1, 2, 2]
    assert [tree.nodes[i].end for i in tree.leaves] == [ANSWERED, ANSWERED, FAILED]
    assert tree.nodes[1].episode.turns[-1].tool == "sparql"
    assert tree.nodes[3].episode.predicted_answers == ["William Dieterle"]


def test_composite_reward_per_node(built, graph):
    _, tree = built
    leaves = {i: tree.nodes[i].episode for i in tree.leaves}
    scores = score_tree(RewardSpec.parse("isp"), tree.parents, leaves, GOLD,
                        distance=GraphDistance(graph))  # fmt: skip
    # node 2's call returned the answer (one hop closer than the topic): progress +1 (x 0.3);
    # node 1's listed relations (no entity): 0; the failed call under node 2: -1
    assert scores.progress[1:] == pytest.approx([0.0, 0.3, 0.0, 0.0, -0.3])
    assert scores.format[1:] == [1.0] * 5
    # max-subtree F1 (x 0.6): node 2's subtree holds the right answer and the failure
    assert scores.best[1:] == pytest.approx([0.6, 0.6, 0.6, 0.6, 0.0])
    assert scores.values[1:] == pytest.approx([0.7, 1.0, 0.7, 0.7, -0.2])
    # mean instead of max: node 2 averages its right answer and its failure
    mean = score_tree(RewardSpec.parse("isp"), tree.parents, leaves, GOLD,
                      distance=GraphDistance(graph), aggregate="mean")  # fmt: skip
    assert mean.best[2] == pytest.approx(0.3)


def _turn(**kw) -> TurnRecord:
    base = dict(text="t", think="t", action=None, query=None)
    return TurnRecord(**{**base, **kw})


def test_composite_reward_on_hand_made_episodes():
    """A root with two children: one answers right in a malformed step (format -1: no outcome
    credit), one answers wrong in a clean step; f1 and format only (no distance)."""
    task = EpisodeTask(QUESTION, ["Kismet"])
    right = Episode(task, turns=[_turn(action="answer", format_error="missing <think> block")],
                    predicted_answers=["William Dieterle"], answered=True)  # fmt: skip
    wrong = Episode(task, turns=[_turn(action="answer")], predicted_answers=["Bette Davis"],
                    answered=True)  # fmt: skip
    spec = RewardSpec.parse("f1:0.3,format:0.1")
    scores = score_tree(spec, [-1, 0, 0], {1: right, 2: wrong}, GOLD)
    assert scores.format == [0.0, -1.0, 1.0]
    assert scores.best == pytest.approx([0.3, 0.3, 0.0])
    assert scores.values == pytest.approx([0.0, -0.1, 0.1])
    # the flat reward of each leaf is still there for the metrics
    assert scores.leaves[1].components["f1"] == 1.0 and scores.leaves[1].components["format"] == 0
    with pytest.raises(ValueError, match="assistant turns"):
        score_tree(spec, [-1, 0, 1], {2: wrong}, GOLD)


def test_sibling_advantages_tie_and_sign():
    parents = [-1, 0, 0, 0, 1, 1, 2]
    tied = sibling_advantages(parents, [0.0, 0.5, 0.5, 0.5, 1.0, 0.2, 0.9])
    assert tied.advantages[1:4] == [0.0, 0.0, 0.0] and not any(tied.trained[1:4])
    assert tied.advantages[4] > 0 > tied.advantages[5] and tied.trained[4] and tied.trained[5]
    assert tied.advantages[6] == 0.0 and not tied.trained[6]  # an only child
    assert (tied.groups, tied.skipped) == (3, 2)
    raw = sibling_advantages(parents, [0.0, 1.0, 0.0, -1.0, 0, 0, 0], scale=False)
    assert raw.advantages[1:4] == pytest.approx([1.0, 0.0, -1.0])
    scaled = sibling_advantages(parents, [0.0, 1.0, 0.0, -1.0, 0, 0, 0])
    std = (2 / 3) ** 0.5
    assert scaled.advantages[1:4] == pytest.approx([1 / std, 0.0, -1 / std], rel=1e-5)


def test_training_rows_carry_each_step_once_with_its_logprobs(built, graph, tiny):
    _, model, _ = tiny
    _, tree = built
    leaves = {i: tree.nodes[i].episode for i in tree.leaves}
    scores = score_tree(RewardSpec.parse("isp"), tree.parents, leaves, GOLD,
                        distance=GraphDistance(graph))  # fmt: skip
    adv = sibling_advantages(tree.parents, scores.values)
    assert adv.trained == [False, True, True, False, True, True]
    assert adv.advantages[2] > 0 > adv.advantages[1] and adv.advantages[4] > 0 > adv.advantages[5]
    rows = tree_sequences(tree, adv)
    spans = {i: tree.nodes[i].span for i in (1, 2, 4, 5)}
    assert sum(sum(r.mask) for r in rows) == sum(e - s for s, e in spans.values())
    for r in rows:
        ids = torch.tensor([r.ids])
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        m = torch.tensor(r.mask).bool()
        assert torch.allclose(lp[0][m], torch.tensor(r.logprobs)[m], atol=1e-4)
        assert all(a != 0.0 for a, k in zip(r.advantages, r.mask, strict=True) if k)


def test_rl_tree_step_on_cpu_updates_weights_and_logs_branches(tiny, tmp_path, monkeypatch):
    """`kgsynth train rl --rollout tree`: one real optimizer step on the tiny model over the
    embedded KG (turns scripted, log-probs real), the branch and prune counts in metrics."""
    import polars as pl
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from kgsynth.cli import app
    from kgsynth.kg.importer import import_kg

    path = tiny[0]
    (tmp_path / "kg.nt").write_text(movie_ntriples())
    import_kg(tmp_path / "kg.nt", tmp_path / "kg", force=True)
    pl.DataFrame(
        [{"question": QUESTION, "topic_names": ["Kismet"], "answer_names": ["William Dieterle"]}]
    ).write_parquet(tmp_path / "q.parquet")

    calls = {"n": 0}

    def sample(self, batch, **kw):
        one = scripted_sample(self.model, self.encode, [SCRIPT[calls["n"] % len(SCRIPT)]])
        calls["n"] += 1
        return one(batch, **kw)

    monkeypatch.setattr(TokenPolicy, "sample", sample)
    out = tmp_path / "rl"
    res = CliRunner().invoke(app, [
        "train", "rl", "--questions", str(tmp_path / "q.parquet"), "--kg", str(tmp_path / "kg"),
        "--init", str(path), "--out", str(out), "--recipe", "tiny", "--rollout", "tree",
        "--branches", "3", "--max-tree-nodes", "4", "--max-turns", "2", "--max-steps", "1",
        "--questions-per-step", "1", "--reward", "isp", "--lr", "1e-2", "--kl-coef", "0",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["tree/branches_sampled"] == 7 and row["tree/branches_pruned"] == 2
    assert row["tree/prune_rate"] == pytest.approx(2 / 7)
    assert row["tree/sampled_by_turn"] == [3, 4] and row["tree/live_by_turn"] == [1, 2]
    assert row["tree/leaves"] == 3 and row["tree/nodes"] == 5
    assert (row["tree/sibling_groups"], row["tree/skipped_sibling_groups"]) == (3, 1)
    assert (row["groups"], row["skipped_groups"]) == (3, 1)
    assert row["trained_tokens"] > 0 and row["grad_norm"] > 0
    assert row["rollout_tokens_per_s"] > 0 and "reward/distance" in row
    before = load_file(str(Path(path) / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_tree_options_are_checked():
    from kgsynth.core.errors import ConfigError
    from kgsynth.train.grpo_config import GRPOConfig

    for bad, field in (({"rollout": "beam"}, "rollout"), ({"branches": 1}, "branches"),
                       ({"max_tree_nodes": 1}, "max_tree_nodes"),
                       ({"tree_value": "min"}, "tree_value")):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            GRPOConfig(**bad)
    # fewer live nodes than branches caps the root's branches too
    assert GRPOConfig(rollout="tree", branches=16, max_tree_nodes=8).max_tree_nodes == 8
