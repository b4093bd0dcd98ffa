"""How much of a GRPO step's gradient is signal (issue 46 item 3): the gradient noise scale
of ``kgsynth train rl`` at its starting weights.

It takes a GRPO run's own settings (``OUT/rl_spec.json`` of a ``kgsynth train rl`` run: the
start model, the KG, the questions, reward, group size, temperature, agent), samples
``--groups`` groups of rollouts with the run's own code (``grpo_step.sample_groups``: the same
engine, tools, rewards and advantages), and computes each group's policy-gradient vector
at the start (the on-policy GRPO loss of the group alone, averaged over its assistant
tokens; at the start the KL term and its gradient are zero). From the n groups with a reward
spread:

- ``|G|^2``: the squared norm of the true mean gradient, unbiased
  (``|mean g|^2 - tr(S) / n``);
- ``tr(S)``: the per-group gradient variance (sample covariance's trace);
- ``B_noise = tr(S) / |G|^2``: McCandlish et al.'s simple noise scale, in groups. A step of
  B groups has signal-to-noise ``|G|^2 / (tr(S) / B) = B / B_noise``: below B_noise groups a
  step is more noise than signal;
- the cosine between the mean gradients of two disjoint halves of the groups (1: the halves
  agree on the direction; 0: no shared direction);

and the reward spread: the share of tied groups and each group's reward std.

    .venv/bin/python benchmarks/grpo_noise.py runs/i43d/rl --groups 64 --group-size 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a kgsynth train rl output folder (rl_spec.json)")
    parser.add_argument("--init", help="the weights to measure at [default: the run's --init]")
    parser.add_argument("--groups", type=int, default=64, help="groups sampled")
    parser.add_argument("--group-size", type=int, help="[default: the run's]")
    parser.add_argument("--temperature", type=float, help="[default: the run's]")
    parser.add_argument("--engine", default="static", help="rollout engine (static, hf)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import torch

    from kgsynth.agent.rewards import RewardState
    from kgsynth.core.config import config_from_record
    from kgsynth.train.grpo import _start
    from kgsynth.train.grpo_config import GRPOConfig
    from kgsynth.train.grpo_loss import token_logprobs
    from kgsynth.train.grpo_run import RLSpec, read_rl_questions, with_topic_names
    from kgsynth.train.grpo_step import LoopState, Sampled, next_questions, sample_groups
    from kgsynth.train.grpo_update import pad_batch

    torch.set_num_threads(1)
    data = json.loads((args.run / "rl_spec.json").read_text())
    record = data["config"]
    if "updates_per_step" in record:  # a run from before the option's new name
        record["ppo_epochs"] = record.pop("updates_per_step")
    spec = RLSpec(
        questions=data["questions"],
        kg=data["kg"],
        profile=data.get("profile"),
        out=str(args.run),
        config=config_from_record(GRPOConfig, record),
    )
    cfg = dataclasses.replace(
        spec.config,
        init=args.init or spec.config.init,
        questions_per_step=args.groups,
        group_size=args.group_size or spec.config.group_size,
        temperature=args.temperature or spec.config.temperature,
        rollout_engine=args.engine,
        kl_coef=0.0,
        seed=args.seed,
        select_questions=None,
    )
    spec = dataclasses.replace(spec, config=cfg)
    torch.manual_seed(cfg.seed)
    run = _start(spec, "cpu", torch.float32, False, None)
    qs = with_topic_names(read_rl_questions(spec.questions), run.graph)
    st = LoopState(qs=qs, rng=random.Random(args.seed), reward_state=RewardState(step=0))
    st.order = list(range(len(qs)))
    st.rng.shuffle(st.order)
    t0 = time.perf_counter()
    sampled = Sampled()
    spread = sample_groups(run, st, 1, next_questions(st, args.groups), sampled, 0)
    t_roll = time.perf_counter() - t0
    model = run.policy.module
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for gi in spread:
        idx = [i for i, g in enumerate(sampled.group_of) if g == gi]
        width = max(len(sampled.rollouts[i]) for i in idx)
        ids = pad_batch([sampled.rollouts[i].ids for i in idx], 0, torch.long, width)
        att = pad_batch([[1] * len(sampled.rollouts[i]) for i in idx], 0, torch.long, width)
        mask = pad_batch([sampled.rollouts[i].mask for i in idx], 0, torch.float32, width)
        adv = pad_batch([sampled.adv[i] for i in idx], 0.0, torch.float32, width)
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, ids, att, cfg.temperature)
        # the on-policy surrogate -A * ratio has the gradient of -A * logp at ratio 1
        loss = -(adv * logp * mask).sum() / mask.sum()
        loss.backward()
        grads.append(torch.cat([p.grad.detach().flatten().double() for p in params]))
    n = len(grads)
    if n < 4:
        raise SystemExit(f"only {n} of {args.groups} groups had a reward spread: sample more")
    g = torch.stack(grads)
    mean = g.mean(0)
    trace = float(((g - mean) ** 2).sum(1).sum() / (n - 1))
    signal = float(mean.pow(2).sum()) - trace / n
    half = n // 2
    a, b = g[:half].mean(0), g[half : 2 * half].mean(0)
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    stds = sampled.group_std
    result = {
        "init": cfg.init,
        "reward": cfg.reward,
        "group_size": cfg.group_size,
        "temperature": cfg.temperature,
        "groups": args.groups,
        "tied": args.groups - n,
        "mean_reward": statistics.fmean(r.total for r in sampled.results),
        "group_reward_std_all": statistics.fmean(stds),
        "group_reward_std_spread": statistics.fmean(s for s in stds if s > 0),
        "per_group_grad_norm": statistics.fmean(float(v.norm()) for v in grads),
        "trace_cov": trace,
        "signal_sq": signal,
        "noise_scale_groups": trace / signal if signal > 0 else math.inf,
        "half_cosine": cosine,
        "rollout_s": round(t_roll, 1),
    }
    print(json.dumps(result, indent=1))
    b_noise = result["noise_scale_groups"]
    print(
        f"groups with a spread: {n} of {args.groups}; B_noise {b_noise:.0f} groups; a step "
        f"training 16 groups: signal/noise {16 / b_noise:.2f}; half-batch cosine {cosine:.3f}"
    )


if __name__ == "__main__":
    main()
