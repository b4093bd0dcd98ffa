"""Agent rollouts/s of the static engine against the hf engine, and against the model's bound
(issue 46, item 2).

Both engines roll out the same episodes: multi-turn agent rollouts (``run_rollouts``, the
GRPO loop's call) of the same questions with the same seed, their tool calls run on the
shipped MetaQA KB, alternating engine by engine, round by round, on one thread. The two
engines sample the same tokens from the same seed (tests/test_static_engine.py), so both
generate the same token count; the run checks it. tokens/s is the sampled tokens over the
wall seconds of a whole rollout (tool calls included); episodes/s likewise; tokens per CPU
second (this process's, less swayed by other work on a shared machine) is reported beside.
The bound is the model's cost per token at the rollouts' mean context (the matmul FLOPs, and
the KV-cache bytes a decode step reads) against this machine's one-thread fp32 matmul rate
and memory bandwidth, measured here.

With no arguments it builds the tiny policy as ``make all`` does (2 layers x 64 wide, a
1,000-token vocabulary; random weights, so its tool calls are mostly malformed and answered
with the environment's hint), imports the shipped KB and takes the shipped dev questions:

    .venv/bin/python benchmarks/bench_rollouts.py
    .venv/bin/python benchmarks/bench_rollouts.py --model runs/x/stage2 --kg runs/x/kg

A trained ``--model`` (a ``make all`` stage-2 folder) brings its agent settings and system
prompt, and its tool calls are real queries. The last line ends with ``ratio: R`` (static
tokens/s over hf tokens/s, the median of the rounds).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METAQA = ROOT / "kgsynth" / "resources" / "metaqa"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a checkpoint folder (default: the tiny policy, built here)")
    ap.add_argument("--kg", help="a KG store (default: the shipped KB, imported here)")
    ap.add_argument("--questions", default=str(METAQA / "dev_sample/metaqa_dev_sample.jsonl"))
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64, help="sequences per generate call")
    ap.add_argument("--max-turns", type=int, help="default: the model's, else 4")
    ap.add_argument("--max-turn-tokens", type=int, help="default: the model's, else 96")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--kv-heads", type=int, default=4,
                    help="the built tiny policy's key-value heads (4 query heads; 1 = grouped)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engines", default="hf,static")
    ap.add_argument("--exact-rng", action="store_true",
                    help="the static engine draws as generate draws: the hf engine's tokens")  # fmt: skip
    ap.add_argument("--out", help="also write the result as JSON here")
    return ap.parse_args()


def tiny_policy(root: Path, questions: list[str], kv_heads: int = 4) -> Path:
    from kgsynth.agent.prompt import system_prompt
    from kgsynth.train.tiny import build_tiny_model

    texts = [system_prompt("graphwalker", 4, "short"), *questions]
    return build_tiny_model(texts, root, vocab_size=1000, hidden_size=64, num_layers=2,
                            num_heads=4, num_kv_heads=kv_heads, init_std=0.02, seed=0)  # fmt: skip


def rollout_config(model_dir: Path, args: argparse.Namespace) -> Any:
    from kgsynth.agent.carried import read_agent_file
    from kgsynth.agent.prompt import stored_system_prompt
    from kgsynth.agent.rollout import RolloutConfig

    carried = read_agent_file(model_dir) or {"system_prompt": "short"}
    values = dict(carried)
    values["max_turns"] = args.max_turns or carried.get("max_turns", 4)
    values["max_turn_tokens"] = args.max_turn_tokens or carried.get("max_turn_tokens", 96)
    return RolloutConfig(**values, system_text=stored_system_prompt(model_dir),
                         temperature=args.temperature, timeout_s=3600.0)  # fmt: skip


def machine_rates() -> dict[str, float]:
    """This thread's fp32 matmul rate (GFLOP/s) and read bandwidth (GB/s), best of a few."""
    import torch

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    big = torch.randn(64 * 1024 * 1024 // 4)  # 64 MB: beyond the caches
    flops, gbs = 0.0, 0.0
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20):
            torch.mm(a, b)
        flops = max(flops, 20 * 2 * 512**3 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        big.sum()
        gbs = max(gbs, big.nelement() * 4 / (time.perf_counter() - t) / 1e9)
    return {"matmul_gflops": round(flops, 1), "read_gb_s": round(gbs, 1)}


def bound(
    model: Any, context: float, prefill: float, batch: int, rates: dict[str, float]
) -> dict[str, float]:
    """Sampled tokens/s the model allows at ``context``: FLOPs per sampled token (the
    weights' matmuls and the attention over the context, for the token itself and for the
    ``prefill`` environment tokens a sampled token brings that must be run once) and bytes
    per sampled token (the KV cache a decode step reads, the weights read once a step for
    ``batch`` rows) against the machine's rates; the bound is the slower of the two."""
    c = model.config
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    emb = c.vocab_size * c.hidden_size
    weights = sum(p.numel() for p in model.parameters()) - (0 if c.tie_word_embeddings else emb)
    matmul = 2 * (weights - emb) + 2 * emb  # every linear, then the head over the vocabulary
    attention = c.num_hidden_layers * 2 * 2 * context * heads * dim
    flops = (matmul + attention) * (1 + prefill)
    size = next(model.parameters()).element_size()
    kv_bytes = c.num_hidden_layers * 2 * kv * dim * context * size
    bytes_ = kv_bytes + weights * size / batch
    by_flops = rates["matmul_gflops"] * 1e9 / flops
    by_bytes = rates["read_gb_s"] * 1e9 / bytes_
    return {"flops_per_token": round(flops), "kv_bytes_per_token": round(kv_bytes),
            "prefill_tokens_per_token": round(prefill, 2),
            "tokens_per_s_by_flops": round(by_flops), "tokens_per_s_by_bytes": round(by_bytes),
            "bound_tokens_per_s": round(min(by_flops, by_bytes))}  # fmt: skip


def roll(engine: Any, model: Any, tok: Any, tasks: list, graph: Any, cfg: Any, batch: int) -> dict:
    """One timed rollout of every task; what it generated, in how long."""
    from kgsynth.agent.rollout import TokenPolicy, run_rollouts
    from kgsynth.agent.tools import ToolEnvironment

    policy = TokenPolicy(model, tok, engine)
    spent = {"s": 0.0}
    generate = engine.generate

    def timed(prompts: Any, params: Any) -> Any:
        t = time.perf_counter()
        out = generate(prompts, params)
        spent["s"] += time.perf_counter() - t
        return out

    engine.generate = timed
    t0, c0 = time.perf_counter(), time.process_time()
    rollouts = run_rollouts(
        policy, tasks, lambda t: ToolEnvironment(graph, t.question, cfg, topics=t.topic_names),
        cfg, seed=0, batch_size=batch,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del engine.generate
    tokens = sum(r.generated_tokens for r in rollouts)
    # the context each sampled token was sampled at
    positions = [i for r in rollouts for i, m in enumerate(r.mask) if m]
    # what must be prefilled at least: the first prompts' distinct tokens (sorted, each shares
    # a prefix with the one before), every environment token
    env = sum(r.mask[r.prompt_len :].count(0) for r in rollouts)
    prompts = sorted({tuple(r.ids[: r.prompt_len]) for r in rollouts})
    firsts = len(prompts[0]) + sum(len(b) - _shared(a, b) for a, b in itertools.pairwise(prompts))
    calls = sum(1 for r in rollouts for t in r.episode.turns if t.tool and not t.tool_error)
    return {"tokens": tokens, "episodes": len(rollouts), "wall_s": wall, "cpu_s": cpu,
            "generate_s": spent["s"], "context": statistics.mean(positions or [0]),
            "prefill_per_token": (env + firsts) / max(1, tokens),
            "tool_calls_run": calls,
            "digest": hash(tuple(tuple(r.ids) for r in rollouts))}  # fmt: skip


def setup(args: argparse.Namespace, work: Path) -> tuple[Any, Any, Any, list, Any]:
    """The model, its tokenizer, the KG, the tasks and the rollout settings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.agent.loop import EpisodeTask
    from kgsynth.datasets.qafiles import read_questions
    from kgsynth.kg.graph import KGGraph
    from kgsynth.kg.open import open_kg

    records = read_questions(Path(args.questions))
    questions = [r.question for r in records]
    model_dir = (
        Path(args.model) if args.model else tiny_policy(work / "tiny", questions, args.kv_heads)
    )
    if args.kg:
        store = args.kg
    else:
        from kgsynth.kg.importer import import_kg

        store = import_kg(METAQA / "kb_partial.txt.gz", work / "kg", force=True).store
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tasks = [EpisodeTask(r.question, r.topic_names) for r in records]
    tasks = (tasks * (args.episodes // max(1, len(tasks)) + 1))[: args.episodes]
    return model, tok, KGGraph(open_kg(store)), tasks, rollout_config(model_dir, args)


def summarize(runs: dict[str, list[dict]], model: Any, args: argparse.Namespace) -> dict:
    """Each engine's median rates, the bound, and whether both sampled the same tokens."""
    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        summary[name] = {
            "tokens_per_s": round(statistics.median(x["tokens"] / x["wall_s"] for x in rs)),
            "episodes_per_s": round(statistics.median(x["episodes"] / x["wall_s"] for x in rs), 2),
            "generate_share": round(statistics.median(x["generate_s"] / x["wall_s"] for x in rs), 2),
            # this process's CPU seconds: on a loaded machine, less swayed than the wall
            "tokens_per_cpu_s": round(statistics.median(x["tokens"] / x["cpu_s"] for x in rs)),
        }  # fmt: skip
    context = statistics.mean(x["context"] for rs in runs.values() for x in rs)
    prefill = statistics.mean(x["prefill_per_token"] for rs in runs.values() for x in rs)
    rates = machine_rates()
    summary["bound"] = {"machine": rates, "mean_context": round(context),
                        **bound(model, context, prefill, args.batch, rates)}  # fmt: skip
    cap = summary["bound"]["bound_tokens_per_s"]
    for name in runs:
        summary[name]["share_of_bound"] = round(summary[name]["tokens_per_s"] / cap, 3)
    summary["same_tokens"] = len({x["digest"] for rs in runs.values() for x in rs}) == 1
    return summary


def _shared(a: tuple, b: tuple) -> int:
    """The length of the prefix two token sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    import torch

    from kgsynth.agent.engines import make_engine
    from kgsynth.agent.static_engine import StaticEngine

    args = parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp:
        model, tok, graph, tasks, cfg = setup(args, Path(tmp))
        engines = {
            name: StaticEngine(model, tok, exact_rng=True)
            if name == "static" and args.exact_rng
            else make_engine(name, model=model, tokenizer=tok)
            for name in args.engines.split(",")
        }
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        # untimed: the KG's caches and the allocator warm up on the cheapest engine
        warm = engines.get("static") or next(iter(engines.values()))
        roll(warm, model, tok, tasks, graph, cfg, args.batch)
        for r in range(args.rounds):
            order = list(engines.items())
            for name, engine in order if r % 2 == 0 else order[::-1]:
                if hasattr(engine, "decoder"):
                    engine.decoder.weights_changed()  # every round starts from an empty cache
                res = roll(engine, model, tok, tasks, graph, cfg, args.batch)
                runs[name].append(res)
                line = {k: round(v, 2) if isinstance(v, float) else v
                        for k, v in res.items() if k != "digest"}  # fmt: skip
                print(json.dumps({"round": r, "engine": name,
                                  "tokens_per_s": round(res["tokens"] / res["wall_s"]),
                                  "episodes_per_s": round(res["episodes"] / res["wall_s"], 2),
                                  **line}), flush=True)  # fmt: skip
    summary = {"model": args.model or "tiny (built here)", "episodes": args.episodes,
               "batch": args.batch, "max_turns": cfg.max_turns,
               "max_turn_tokens": cfg.max_turn_tokens, "exact_rng": args.exact_rng,
               "threads": 1, **summarize(runs, model, args)}  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    if "hf" in runs and "static" in runs:
        ratio = statistics.median(
            s["tokens"] / s["wall_s"] / (h["tokens"] / h["wall_s"])
            for s, h in zip(runs["static"], runs["hf"], strict=True)
        )
        per_cpu = summary["static"]["tokens_per_cpu_s"] / summary["hf"]["tokens_per_cpu_s"]
        print(f"static engine {summary['static']['tokens_per_s']} tokens/s, hf engine "
              f"{summary['hf']['tokens_per_s']} tokens/s, bound "
              f"{summary['bound']['bound_tokens_per_s']}, same tokens {summary['same_tokens']}, "
              f"per CPU second {per_cpu:.2f}; ratio: {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
