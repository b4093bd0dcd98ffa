"""GRPO: advantage and loss math by hand, masking, token-in/token-out rollouts, the CLI."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kgsynth.agent.loop import EpisodeTask  # noqa: E402
from kgsynth.agent.rollout import (  # noqa: E402
    RolloutConfig,
    TokenPolicy,
    check_alignment,
    run_rollouts,
)
from kgsynth.agent.tools import ToolConfig, ToolEnvironment  # noqa: E402
from kgsynth.kg.graph import KGGraph  # noqa: E402
from kgsynth.train.grpo import (  # noqa: E402
    degenerate,
    group_advantages,
    grpo_token_loss,
    token_advantages,
    token_logprobs,
)
from tests.kgfixtures import movie_kg  # noqa: E402

# ---------------------------------------------------------------------------------------------
# math


def test_group_advantages_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])
    # rewards 3, 1: mean 2, std 1
    assert group_advantages([3.0, 1.0], eps=0.0) == pytest.approx([1.0, -1.0])
    # without std scaling (Dr. GRPO): just centred
    assert group_advantages([0.9, 0.1, 0.2], scale=False) == pytest.approx([0.5, -0.3, -0.2])
    # all equal: zero advantages, and the group is degenerate (skipped)
    assert group_advantages([0.5, 0.5]) == [0.0, 0.0]
    assert degenerate([0.5, 0.5, 0.5]) and not degenerate([0.5, 0.5, 0.6])


def test_token_advantages_with_turns():
    turn_of = [-1, -1, 0, 0, -1, 1, 1]
    assert token_advantages(turn_of, None, 0.5) == [0, 0, 0.5, 0.5, 0, 0.5, 0.5]
    # KG-R1: each turn's tokens carry that turn's own advantage (a turn beyond the list: 0)
    assert token_advantages(turn_of, [0.25, -1.0]) == [0, 0, 0.25, 0.25, 0, -1.0, -1.0]
    assert token_advantages(turn_of, [0.25]) == [0, 0, 0.25, 0.25, 0, 0.0, 0.0]


def test_loss_matches_hand_computation():
    # three tokens, the middle one masked out
    logp = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)]], requires_grad=True)
    old = torch.log(torch.tensor([[0.25, 0.1, 0.6]]))
    ref = torch.log(torch.tensor([[0.5, 0.5, 0.4]]))
    adv = torch.tensor([[1.0, 7.0, -2.0]])
    mask = torch.tensor([[1, 0, 1]])
    loss, stats = grpo_token_loss(
        logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, kl_coef=0.1, total_tokens=2
    )
    # token 0: ratio 2 > 1.28 with A > 0 -> clipped: -1.28 * 1; token 2: ratio 0.5 < 0.8 with
    # A < 0 -> clipped: -(0.8 * -2) = 1.6
    pg = [-1.28, 1.6]
    # k3 = exp(ref - logp) - (ref - logp) - 1
    k3 = [
        0.0,  # ref == logp
        (0.4 / 0.3) - math.log(0.4 / 0.3) - 1,
    ]
    expected = (pg[0] + 0.1 * k3[0] + pg[1] + 0.1 * k3[1]) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert float(stats["clipped"]) == 2 and float(stats["tokens"]) == 2
    assert float(stats["kl"]) == pytest.approx(sum(k3), rel=1e-5)


def test_unclipped_gradient_is_minus_advantage_over_tokens():
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    old = logp.detach().clone()  # on-policy: ratio 1, no clipping
    adv = torch.tensor([[2.0, -1.0]])
    loss, stats = grpo_token_loss(
        logp,
        old,
        None,
        adv,
        torch.ones(1, 2),
        clip_low=0.2,
        clip_high=0.28,
        kl_coef=0.0,
        total_tokens=2,
    )
    loss.backward()
    # d/dlogp of -(exp(logp - old) * A) / 2 at ratio 1 = -A / 2
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 0.5])
    assert float(stats["clipped"]) == 0


def test_masked_tokens_get_no_gradient():
    logp = torch.randn(2, 6).log_softmax(-1).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(2, 6)
    ref = logp.detach() - 0.2
    adv = torch.randn(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]])
    loss, _ = grpo_token_loss(
        logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, kl_coef=0.5, total_tokens=5
    )
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert torch.any(logp.grad[mask == 1] != 0)


# ---------------------------------------------------------------------------------------------
# rollouts, token in / token out


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.kgfixtures import tiny_agent_model

    path = tiny_agent_model(tmp_path_factory.mktemp("tiny"), vocab_size=600)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tok


def _script_sampler(policy: TokenPolicy, turns: list[str]):
    """Replace sampling by fixed turn texts (tokenized), keeping real log-probs from the model."""
    real = policy.sample
    calls = {"n": 0}

    def sample(batch, *, max_new_tokens, temperature, top_p):
        out = []
        for ids in batch:
            text = turns[min(calls["n"], len(turns) - 1)]
            new = policy.encode(text)
            full = torch.tensor([list(ids) + new])
            lp, _ = token_logprobs(policy.model, full, torch.ones_like(full), temperature)
            out.append((new, lp[0, len(ids) :].tolist(), False))
        calls["n"] += 1
        return out

    policy.sample = sample
    return real


def _scripted_rollout(tiny_policy, turns: list[str], cfg: RolloutConfig, question="q?"):
    """One rollout of a policy whose turns are ``turns``, on the fixture KG."""
    model, tok = tiny_policy
    graph = KGGraph(movie_kg())
    policy = TokenPolicy(model, tok)
    _script_sampler(policy, turns)
    (r,) = run_rollouts(
        policy,
        [EpisodeTask(question, ["Kismet"])],
        lambda t: ToolEnvironment(graph, t.question, ToolConfig()),
        cfg,
    )
    check_alignment(r)
    return policy, r


def test_rollout_ids_masks_logprobs_agree_with_a_forward_pass(tiny_policy):
    model, tok = tiny_policy
    kg = movie_kg()
    graph = KGGraph(kg)
    policy = TokenPolicy(model, tok)
    tasks = [EpisodeTask("who directed Kismet?", ["Kismet"])] * 3
    cfg = RolloutConfig(max_turns=2, max_turn_tokens=24, max_obs_tokens=64, temperature=1.0)
    rollouts = run_rollouts(
        policy, tasks, lambda t: ToolEnvironment(graph, t.question, ToolConfig()), cfg, seed=0
    )
    for r in rollouts:
        check_alignment(r)
        ids = torch.tensor([r.ids])
        lp, ent = token_logprobs(model, ids, torch.ones_like(ids))
        m = torch.tensor(r.mask).bool()
        assert m.sum() == r.generated_tokens > 0
        assert torch.allclose(lp[0][m], torch.tensor(r.logprobs)[m], atol=1e-4)
        # the LM head at the positions that predict sampled tokens only: the same values there
        # and 0 elsewhere
        only, only_ent = token_logprobs(model, ids, torch.ones_like(ids), mask=m[None])
        assert torch.allclose(only[0][m], lp[0][m], atol=1e-5)
        assert torch.allclose(only_ent[0][m], ent[0][m], atol=1e-5)
        assert not only[0][~m].any() and not only_ent[0][~m].any()
        # the prompt is exactly the chat template's rendering
        prompt = policy.prompt_ids(r.episode.messages[:2])
        assert r.ids[: r.prompt_len] == prompt
        assert all(v == 0 for v in r.mask[: r.prompt_len])


def test_observation_tokens_are_appended_unmasked_and_never_re_encoded(tiny_policy):
    tok = tiny_policy[1]
    turns = [
        '<think>look</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>',
        '<think>done</think><answer>["William Dieterle"]</answer>',
    ]
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=64, max_obs_tokens=64)
    policy, r = _scripted_rollout(tiny_policy, turns, cfg, "who directed Kismet?")
    ep = r.episode
    assert ep.predicted_answers == ["William Dieterle"] and ep.answered
    # sampled turn tokens are exactly the scripted ones, in order, and masked in
    sampled = [t for t, m in zip(r.ids, r.mask, strict=True) if m]
    assert sampled == policy.encode(turns[0]) + policy.encode(turns[1])
    assert r.turn_of.count(0) == len(policy.encode(turns[0]))
    # the observation the environment returned is in the ids, masked out
    obs = ep.messages[3]
    assert obs["role"] == "tool" and "William Dieterle" in obs["content"]
    text_out = tok.decode([t for t, m in zip(r.ids, r.mask, strict=True) if not m])
    assert obs["content"] in text_out
    # the whole id sequence renders as the SFT renderer's conversation (same template)
    from kgsynth.agent.render import render_messages

    rendered = render_messages(tok, ep.messages)
    assert tok.decode(r.ids) == rendered.text.rstrip("\n").removesuffix(tok.eos_token)


def test_observation_cap_and_forced_final_answer(tiny_policy):
    tok = tiny_policy[1]
    turns = ['<think>a</think><kg-query>get_relations("Kismet")</kg-query>'] * 5
    cfg = RolloutConfig(max_turns=2, max_turn_tokens=64, max_obs_tokens=8)
    _, r = _scripted_rollout(tiny_policy, turns, cfg, "who directed Kismet?")
    assert r.truncated_observations == 2
    assert r.episode.forced_answer
    text = tok.decode(r.ids)
    assert text.count("You have used all your turns") == 1
    assert "observation truncated" in text
    # two tool turns + the forced turn
    assert max(r.turn_of) == 2


def test_rollout_timeout_ends_the_episode(tiny_policy):
    turns = ['<think>a</think><kg-query>get_relations("Kismet")</kg-query>']
    cfg = RolloutConfig(max_turns=5, max_turn_tokens=32, timeout_s=1e-9)
    _, r = _scripted_rollout(tiny_policy, turns, cfg)
    assert r.timed_out and len(r.episode.turns) == 1
