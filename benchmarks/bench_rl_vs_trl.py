"""Rollout tokens/s of kgsynth's GRPO loop against TRL's GRPOTrainer, side by side in one run.

Same tiny model (built from a config, as `make all` builds it), same sampling (temperature 1,
64 new tokens at most), same completions per step (4 prompts x 8). kgsynth rolls out its
agent protocol on the shipped MetaQA KB (`kgsynth train rl`'s loop, one turn plus the forced
answer turn); TRL generates single-turn completions of the same questions. Both sides are timed
the same way: every call of transformers' `generate` is wrapped, and tokens/s is the generated
(non-padding) tokens over the seconds spent inside `generate`. Alternating A/B rounds.

    .venv/bin/python benchmarks/bench_rl_vs_trl.py --kg runs/default/kg --questions runs/default/questions/questions.parquet
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers.generation.utils as gen_utils

TIMING = {"s": 0.0, "tokens": 0}
_orig = gen_utils.GenerationMixin.generate


def _timed_generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = _orig(self, *args, **kwargs)
    TIMING["s"] += time.perf_counter() - t0
    ids = kwargs.get("input_ids", args[0] if args else None)
    seq = out.sequences if hasattr(out, "sequences") else out
    if ids is not None:
        new = seq[:, ids.shape[1] :]
        pad = self.generation_config.pad_token_id
        TIMING["tokens"] += int((new != pad).sum()) if pad is not None else new.numel()
    return out


gen_utils.GenerationMixin.generate = _timed_generate


def _reset() -> None:
    TIMING["s"], TIMING["tokens"] = 0.0, 0


def run_kgsynth(model_dir: str, kg: str, questions: str, steps: int, out: Path) -> float:
    from kgsynth.agent.config import AgentConfig
    from kgsynth.train.grpo import GRPOConfig, RLSpec, resolve_config, train_grpo

    agent = AgentConfig(max_turns=1, max_turn_tokens=64)
    cfg = resolve_config(
        GRPOConfig(init=model_dir, lr=1e-5, group_size=8, questions_per_step=4, max_steps=steps,
                   agent=agent, temperature=1.0, kl_coef=0.0, save_steps=10_000)
    )  # fmt: skip
    _reset()
    train_grpo(RLSpec(questions, kg, None, str(out), cfg))
    return TIMING["tokens"] / TIMING["s"]


def run_engine(model_dir: str, prompts: list[str], steps: int) -> float:
    """kgsynth's rollout engine (TokenPolicy.sample, what run_rollouts calls each turn) on
    TRL's single-turn task: the same prompts, 4 x 8 completions per step, one batch each."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.agent.rollout import TokenPolicy

    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = TokenPolicy(AutoModelForCausalLM.from_pretrained(model_dir), tok)
    _reset()
    for step in range(steps):
        batch = [tok(prompts[step * 4 + k])["input_ids"] for k in range(4) for _ in range(8)]
        policy.sample(batch, max_new_tokens=64, temperature=1.0, top_p=1.0)
    return TIMING["tokens"] / TIMING["s"]


def run_trl(model_dir: str, prompts: list[str], steps: int, out: Path) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(out), num_generations=8, per_device_train_batch_size=32,
        generation_batch_size=32, max_completion_length=64, temperature=1.0, beta=0.0,
        max_steps=steps, learning_rate=1e-5, logging_steps=1000, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": prompts[: steps * 4 * 2]})

    def reward(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [float(len(c) % 3 == 0) for c in completions]

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=tok)  # fmt: skip
    _reset()
    trainer.train()
    return TIMING["tokens"] / TIMING["s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kg", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--model", help="a checkpoint folder (default: a tiny model built here)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/rl_vs_trl.json")
    ns = ap.parse_args()
    torch.set_num_threads(1)
    from kgsynth.agent.loop import system_prompt, user_prompt
    from kgsynth.train.grpo import read_rl_questions

    qs = read_rl_questions(ns.questions)
    tmp = Path(tempfile.mkdtemp(prefix="rl-vs-trl-"))
    model_dir = ns.model
    if model_dir is None:
        from kgsynth.train.tiny import build_tiny_model

        texts = [system_prompt("graphwalker", 1, "short")] + [q.question for q in qs[:2000]]
        model_dir = str(build_tiny_model(texts, tmp / "tiny", vocab_size=1000, seed=0))
    prompts = [
        system_prompt("graphwalker", 1, "short") + "\n" + user_prompt(q.question, q.topic_names)
        for q in qs[:4000]
    ]
    rows = []
    for r in range(ns.rounds):
        k = run_kgsynth(model_dir, ns.kg, ns.questions, ns.steps, tmp / f"k{r}")
        e = run_engine(model_dir, prompts, ns.steps)
        t = run_trl(model_dir, prompts, ns.steps, tmp / f"t{r}")
        rows.append({"round": r, "kgsynth_agent_rollouts_tokens_per_s": round(k, 1),
                     "kgsynth_engine_single_turn_tokens_per_s": round(e, 1),
                     "trl_tokens_per_s": round(t, 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    single = statistics.median(
        x["kgsynth_engine_single_turn_tokens_per_s"] / x["trl_tokens_per_s"] for x in rows
    )
    agent = statistics.median(
        x["kgsynth_agent_rollouts_tokens_per_s"] / x["trl_tokens_per_s"] for x in rows
    )
    result = {"rounds": rows, "engine_single_turn_over_trl": round(single, 2),
              "agent_rollouts_over_trl": round(agent, 2), "threads": 1}  # fmt: skip
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=2))
    print(f"kgsynth engine, single turn / TRL: {single:.2f}x (goal >= 1.0x); "
          f"kgsynth agent rollouts (2 turns, KG observations) / TRL: {agent:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
