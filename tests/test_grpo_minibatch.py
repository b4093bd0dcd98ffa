"""PPO mini-batches and the loss's aggregation in the GRPO update (issue 42).

A step's questions are cut into ``ppo_mini_batch`` questions each, one optimizer step per
mini-batch and ``ppo_epochs`` passes (KBQA-R1 §V-A4: PPO mini-batch 128 of a batch of 256);
``loss_agg seq-mean-token-mean`` averages each sequence's tokens and then the sequences
(GraphWalker Eq. 4, ISP-KGR App. G.1). The tiny model is real; the optimizer's steps are
counted by a hook on its ``step``, and what each step trained on is read off the model's
forward passes with gradients."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

QUESTIONS, G = 4, 2  # a step: 4 questions x 2 rollouts = 8 rollouts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from tests.kgfixtures import tiny_agent_model

    return str(tiny_agent_model(tmp_path_factory.mktemp("tiny"), vocab_size=400))


def _rollouts(vocab: int) -> tuple[list, list]:
    """A step's rollouts, group after group, each with a distinct first token (its tag)."""
    from kgsynth.agent.rollout import Rollout

    rng = random.Random(3)
    rollouts, adv = [], []
    for i in range(QUESTIONS * G):
        n = rng.randint(10, 20)
        ids = [100 + i] + [rng.randrange(vocab) for _ in range(n - 1)]
        mask = [0] * 4 + [1] * (n - 4)
        a = 1.0 if i % 2 else -1.0
        rollouts.append(Rollout(None, ids, mask, [0.0] * n, [0] * n, 4))  # type: ignore[arg-type]
        adv.append([a if m else 0.0 for m in mask])
    return rollouts, adv


def _run_update(model_dir: str, **options):
    """One update on the step's rollouts; the optimizer steps taken and, for each, the rollout
    tags of the forward passes (with gradients) that fed it."""
    import torch
    from transformers import AutoModelForCausalLM

    from kgsynth.train.grpo import GRPOConfig, Policy, update

    torch.manual_seed(0)
    cfg = GRPOConfig(init=model_dir, lr=1e-3, group_size=G, questions_per_step=QUESTIONS, **options)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    policy = Policy(model, cfg, "cpu", False)
    seen: list[int] = []
    steps: list[list[int]] = []

    def record(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if torch.is_grad_enabled():
            seen.extend(int(t) for t in ids[:, 0])

    model.register_forward_pre_hook(record, with_kwargs=True)

    grads: list[list] = []

    def counted_step(_optimizer, _args, _kwargs):
        steps.append(sorted(seen))
        seen.clear()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])

    policy.optimizer.register_step_pre_hook(counted_step)
    rollouts, adv = _rollouts(model.config.vocab_size)
    question_of = [i // G for i in range(len(rollouts))]
    stats = update(
        policy, ref, rollouts, adv, list(range(len(rollouts))), cfg, "cpu",
        torch.autocast("cpu", enabled=False), question_of=question_of,
    )  # fmt: skip
    stats["_rollout_tokens"] = sum(sum(r.mask) for r in rollouts)
    stats["_grads"] = grads  # each optimizer step's gradients (after clipping)
    return stats, steps, policy


def test_half_batch_mini_batches_take_two_steps_on_half_the_rollouts_each(model_dir):
    stats, steps, policy = _run_update(model_dir, ppo_mini_batch=QUESTIONS // 2)
    tags = [100 + i for i in range(QUESTIONS * G)]
    assert steps == [tags[:4], tags[4:]]  # questions 0-1, then 2-3, each with its group
    assert stats["optimizer_steps"] == 2
    assert policy.sched.last_epoch == 1  # the learning-rate schedule: once per RL step
    assert stats["trained_tokens"] == stats["_rollout_tokens"]


def test_epochs_pass_over_every_mini_batch_again(model_dir):
    _, steps, policy = _run_update(model_dir, ppo_mini_batch=2, ppo_epochs=2)
    tags = [100 + i for i in range(QUESTIONS * G)]
    assert steps == [tags[:4], tags[4:], tags[:4], tags[4:]]
    assert policy.sched.last_epoch == 1


def test_the_old_whole_batch_updates_are_ppo_epochs_without_mini_batches(model_dir):
    # kgsynth's earlier updates_per_step 2: two optimizer steps, each on every rollout
    _, steps, _ = _run_update(model_dir, ppo_epochs=2)
    tags = [100 + i for i in range(QUESTIONS * G)]
    assert steps == [tags, tags]
    # a mini-batch at or above the step's questions is the whole step
    _, steps, _ = _run_update(model_dir, ppo_mini_batch=128)
    assert steps == [tags]


def test_mini_batches_cut_at_questions_and_need_them():
    from kgsynth.train.grpo_config import GRPOConfig, optimizer_steps
    from kgsynth.train.grpo_update import mini_batches

    cfg = GRPOConfig(group_size=2, questions_per_step=5, ppo_mini_batch=2, ppo_epochs=3)
    assert optimizer_steps(cfg) == 9  # 3 mini-batches (2, 2, 1 questions) x 3 passes
    # this rank holds questions 1 and 4 (two rollouts each); rollout 2 was skipped
    question_of = [1, 1, 4, 4]
    assert mini_batches([0, 1, 3], question_of, cfg) == [[0, 1], [], [3]]
    with pytest.raises(ValueError, match="question"):
        mini_batches([0, 1], None, cfg)


def _two_sequences():
    """Two sequences, lengths 1 and 3 (the first padded to 3), with hand-picked ratios."""
    import torch

    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    old = torch.zeros((2, 3))
    logp = torch.log(torch.tensor([[1.5, 1.0, 1.0], [1.0, 0.5, 1.0]]))
    adv = torch.tensor([[2.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    return logp, old, adv, mask


def test_seq_mean_token_mean_by_hand():
    from kgsynth.train.grpo_loss import grpo_token_loss

    logp, old, adv, mask = _two_sequences()
    common = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0, total_tokens=4)
    # sequence 1: ratio 1.5 clipped to 1.28, A 2 -> -2.56
    # sequence 2: A -1; ratios 1, 0.5 (clipped up to 0.8 the pessimistic side), 1 -> 1, 0.8, 1
    seq1, seq2 = -2.56, (1.0 + 0.8 + 1.0) / 3
    loss, stats = grpo_token_loss(
        logp, old, None, adv, mask, loss_agg="seq-mean-token-mean", total_seqs=2, **common
    )
    assert float(loss) == pytest.approx((seq1 + seq2) / 2, abs=1e-6)  # -0.81333
    token, _ = grpo_token_loss(logp, old, None, adv, mask, **common)
    assert float(token) == pytest.approx((-2.56 + 2.8) / 4, abs=1e-6)  # 0.06: not the same
    assert float(stats["tokens"]) == 4 and float(stats["clipped"]) == 2
    with pytest.raises(ValueError, match="loss_agg"):
        grpo_token_loss(logp, old, None, adv, mask, loss_agg="seq-sum", **common)


def test_seq_mean_is_the_same_whatever_the_micro_batches(model_dir):
    a, _, _ = _run_update(model_dir, loss_agg="seq-mean-token-mean", micro_batch_size=8)
    b, _, _ = _run_update(model_dir, loss_agg="seq-mean-token-mean", micro_batch_size=3)
    t, _, _ = _run_update(model_dir, micro_batch_size=8)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert math.isfinite(a["loss"]) and abs(a["loss"] - t["loss"]) > 1e-6


def test_config_checks_name_the_field():
    from kgsynth.core.errors import ConfigError
    from kgsynth.train.grpo_config import GRPOConfig

    for options, field in (
        ({"ppo_mini_batch": 0}, "ppo_mini_batch"),
        ({"ppo_epochs": 0}, "ppo_epochs"),
        ({"loss_agg": "sum"}, "loss_agg"),
    ):
        with pytest.raises(ConfigError, match=field):
            GRPOConfig(**options)


def test_rl_dry_run_shows_the_settings(tmp_path):
    import json

    from typer.testing import CliRunner

    from kgsynth.cli import app

    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    q = Path(tmp_path / "q.jsonl")
    q.write_text('{"question": "q", "topic_names": ["A"], "answer_names": ["B"]}\n')
    res = CliRunner().invoke(
        app,
        ["train", "rl", "--questions", str(q), "--init", str(init), "--out",
         str(tmp_path / "rl"), "--dry-run", "--ppo-mini-batch", "2", "--updates-per-step", "3",
         "--loss-agg", "seq-mean-token-mean"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.output[res.output.index("{") :])["config"]
    assert (cfg["ppo_mini_batch"], cfg["ppo_epochs"], cfg["loss_agg"]) == (
        2, 3, "seq-mean-token-mean",
    )  # fmt: skip


def test_a_tree_rows_steps_are_sequences_of_their_own():
    """ISP-KGR App. G.1 averages each action's tokens: a tree row holding two trained steps
    (lengths 1 and 3) counts as two sequences, weighted 1 and 1/3 per token."""
    from kgsynth.train.grpo_loss import grpo_token_loss
    from kgsynth.train.grpo_tree import TrainSequence
    from kgsynth.train.grpo_update import sequences, token_weights

    mask = [0, 1, 0, 1, 1, 1]
    row = TrainSequence([5] * 6, mask, [0.0] * 6, [0.0] * 6, [(1, 2), (3, 6), (6, 6)])
    assert sequences(row) == [(1, 2), (3, 6)]  # the empty span is no sequence
    assert token_weights(row) == [0.0, 1.0, 0.0, 1 / 3, 1 / 3, 1 / 3]
    flat = TrainSequence([5] * 6, mask, [0.0] * 6, [0.0] * 6)  # no segments: one sequence
    assert sequences(flat) == [(0, 6)] and token_weights(flat)[1] == 0.25
    # the two sequences of _two_sequences() laid end to end in one row: the same loss
    import torch

    logp, old, adv, m = _two_sequences()
    one = lambda t: torch.cat([t[0, :1], t[1]]).unsqueeze(0)  # noqa: E731
    weights = torch.tensor([[1.0, 1 / 3, 1 / 3, 1 / 3]])
    loss, _ = grpo_token_loss(
        one(logp), one(old), None, one(adv), one(m), clip_low=0.2, clip_high=0.28,
        kl_coef=0.0, total_tokens=4, loss_agg="seq-mean-token-mean", total_seqs=2,
        token_weights=weights,
    )  # fmt: skip
    assert float(loss) == pytest.approx((-2.56 + 2.8 / 3) / 2, abs=1e-6)


def test_micro_batches_are_cut_in_order_of_length_and_train_the_same(model_dir):
    """The update pads each micro-batch to its longest rollout; cut in order of length, a
    step's micro-batches hold rollouts of near lengths, and the weights after the update are
    those of one micro-batch holding every rollout (the loss is a sum over the mini-batch)."""
    import torch

    from kgsynth.train.grpo_config import GRPOConfig
    from kgsynth.train.grpo_update import _micro_batches

    rollouts, adv = _rollouts(400)
    cfg = GRPOConfig(group_size=G, questions_per_step=QUESTIONS, micro_batch_size=3)
    micro = _micro_batches(rollouts, adv, list(range(len(rollouts))), cfg, "cpu")
    widths = [ids.shape[1] for ids, *_ in micro]
    lengths = sorted(len(r) for r in rollouts)
    assert widths == [lengths[min(k + 2, len(lengths) - 1)] for k in range(0, len(lengths), 3)]
    # the same rows, each once
    tags = sorted(int(t) for ids, *_ in micro for t in ids[:, 0])
    assert tags == [100 + i for i in range(len(rollouts))]

    whole, _, _ = _run_update(model_dir, micro_batch_size=8)
    cut, _, _ = _run_update(model_dir, micro_batch_size=3)
    (g_whole,), (g_cut,) = whole["_grads"], cut["_grads"]
    assert len(g_whole) == len(g_cut) > 0
    for a, b in zip(g_whole, g_cut, strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-4)
    assert whole["loss"] == pytest.approx(cut["loss"], abs=1e-6)
