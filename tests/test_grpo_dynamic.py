"""DAPO's dynamic sampling in `kgsynth train rl` (`--dynamic-sampling`): a group whose rewards
all tie is replaced by the group of a question drawn next, so that every step trains on
``--questions-per-step`` groups with a reward spread; and its no-signal control
(`--shuffle-rewards`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.train.grpo_config import GRPOConfig
from kgsynth.train.grpo_step import refill_size

pytest.importorskip("torch")

import tests.test_grpo_train as rl_task

# the learnable task of test_grpo_train (an SFT policy right on some one-hop questions) and its
# one-thread setting, shared rather than trained twice
task, sft, one_thread, _rl = rl_task.task, rl_task.sft, rl_task.one_thread, rl_task._rl

STEPS, QUESTIONS = 4, 3


def test_refill_size_expects_the_missing_groups_at_the_share_seen():
    # 3 of 16 sampled groups had a spread: 2 more missing -> ceil(2 * 16 / 3) = 11
    assert refill_size(2, 16, 3, 16) == 11
    # never fewer than the missing ones, never more than a step's worth
    assert refill_size(5, 6, 6, 16) == 5
    assert refill_size(10, 16, 1, 16) == 16
    # nothing with a spread yet: a whole step's worth
    assert refill_size(4, 16, 0, 16) == 16


def test_config_checks_name_the_field():
    with pytest.raises(ConfigError, match="dynamic_sampling_rounds must be >= 1"):
        GRPOConfig(dynamic_sampling=True, dynamic_sampling_rounds=0)
    with pytest.raises(ConfigError, match="dynamic_sampling applies to flat rollouts"):
        GRPOConfig(dynamic_sampling=True, rollout="tree")


def _metrics(task: Path, sft: Path, out: Path, *extra: str, group: int = 2) -> list[dict]:
    # groups of 2 at temperature 1 on a half-right policy: about half the groups tie
    res = _rl(
        task, out, "--init", str(sft), "--max-steps", str(STEPS), "--group-size", str(group),
        "--questions-per-step", str(QUESTIONS), "--lr", "1e-4", "--temperature", "1.0",
        "--seed", "3", *extra,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_tied_groups_are_refilled_so_every_step_trains_on_full_groups(
    task: Path, sft: Path, tmp_path: Path
):
    plain = _metrics(task, sft, tmp_path / "plain")
    # without it, tied groups are skipped and some step trains on fewer groups
    assert all(r["groups"] == QUESTIONS for r in plain)
    assert all(r["trained_groups"] == r["groups"] - r["skipped_groups"] for r in plain)
    assert min(r["trained_groups"] for r in plain) < QUESTIONS
    assert "refill_rounds" not in plain[0]

    dyn = _metrics(
        task, sft, tmp_path / "dyn", "--dynamic-sampling", "--dynamic-sampling-rounds", "8"
    )
    for r in dyn:
        # every step trains on a full batch of groups with a spread, refilled where needed
        assert r["trained_groups"] == QUESTIONS, r
        assert r["groups"] >= QUESTIONS + r["skipped_groups"]
        assert (r["refill_rounds"] > 0) == (r["groups"] > QUESTIONS)
        # the reward and its components are over every rollout sampled, refills included
        assert 0.0 <= r["reward"] <= 1.0 and r["group_reward_std"] > 0
    assert sum(r["refill_rounds"] for r in dyn) > 0


def test_refill_rounds_run_out_where_no_group_has_a_spread(task: Path, sft: Path, tmp_path: Path):
    # at a near-zero temperature every rollout of a question is the same: every group ties,
    # and after --dynamic-sampling-rounds the step trains on none (as without refills). 0.01
    # was not near enough: this policy's top two logits at one step of one question differ by
    # 0.013, and at T 0.01 the second is drawn one time in five
    rows = _metrics(
        task, sft, tmp_path / "cold", "--dynamic-sampling", "--dynamic-sampling-rounds", "2",
        "--temperature", "0.0001",
    )  # fmt: skip
    for r in rows:
        assert r["refill_rounds"] == 2 and r["trained_groups"] == 0
        assert r["skipped_groups"] == r["groups"] == QUESTIONS * 3  # 3, then a step's worth twice
        assert r["trained_tokens"] == 0


def test_shuffled_rewards_keep_the_rollouts_and_change_the_update(
    task: Path, sft: Path, tmp_path: Path
):
    # the control: the same rollouts (the same seeds) and each group's same rewards, given to
    # other rollouts of the group, so the step's mean reward is the same and its gradient not
    # groups of 4: in a group of 2 a shuffle at most negates the gradient, whose norm stays
    plain = _metrics(task, sft, tmp_path / "plain", group=4)[0]
    shuffled = _metrics(task, sft, tmp_path / "shuffled", "--shuffle-rewards", group=4)[0]
    assert shuffled["reward"] == pytest.approx(plain["reward"])
    assert shuffled["generated_tokens"] == plain["generated_tokens"]
    assert shuffled["skipped_groups"] == plain["skipped_groups"] < QUESTIONS
    assert shuffled["grad_norm"] != pytest.approx(plain["grad_norm"], rel=1e-4)
