"""Rollout tokens/s of the hf engine against the vllm engine on the same model (issue 16, item 3).

Each engine samples the same batches of chat prompts (token ids) with the same sampling
parameters through :meth:`RolloutEngine.generate`, the call ``TokenPolicy.sample`` makes each
turn; tokens/s is the generated tokens over the wall seconds of those calls (after one warm-up
batch), alternating engines round by round. Without a model folder it builds the tiny model.
An engine that cannot run here (vllm without vLLM or without a CUDA GPU) is reported with the
reason instead of a figure.

    .venv/bin/python benchmarks/bench_rollout_engines.py [--model runs/x/stage2] \\
        [--engines hf,vllm] [--batch 64] [--new-tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def tiny_model(root: Path) -> Path:
    from kgsynth.agent.loop import system_prompt
    from kgsynth.train.tiny import build_tiny_model

    texts = [system_prompt("graphwalker", 2), "who directed Kismet Juarez Jezebel Bette Davis"] * 4
    return build_tiny_model(texts, root, vocab_size=1000, hidden_size=128, num_heads=2, seed=0)


def build(name: str, model_dir: Path, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.agent.engines import make_engine

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    engine = make_engine(
        name, model=model, tokenizer=tok, model_dir=str(model_dir),
        gpu_memory_utilization=0.3, dtype="bfloat16" if device == "cuda" else "float32",
    )  # fmt: skip
    return engine, tok


def timed(engine: Any, prompts: list[list[int]], params: Any) -> tuple[int, float]:
    import torch

    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return sum(len(c.ids) for c in outs), time.perf_counter() - t0


def main() -> None:
    import torch

    from kgsynth.agent.engines import EngineUnavailable, SamplingParams
    from kgsynth.agent.render import chat_text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a save_pretrained folder (default: the tiny model)")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = Path(args.model) if args.model else tiny_model(Path(tempfile.mkdtemp()))
    engines, result = {}, {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "model": str(model_dir), "batch": args.batch,
                           "new_tokens": args.new_tokens, "tokens_per_s": {}, "unavailable": {}}  # fmt: skip
    tok = None
    for name in args.engines.split(","):
        try:
            engines[name], tok = build(name, model_dir, device)
        except EngineUnavailable as exc:
            result["unavailable"][name] = str(exc)
    if not engines:
        print(json.dumps(result, indent=1))
        return
    questions = ["who directed Kismet?", "when was Juarez released?", "who starred in Jezebel?"]
    texts = [chat_text(tok, [{"role": "user", "content": q}], True) for q in questions]
    prompts = [
        list(tok(texts[i % len(texts)], add_special_tokens=False)["input_ids"])
        for i in range(args.batch)
    ]
    # no stop ids: every sequence runs to the budget, so both engines generate the same count
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    for engine in engines.values():
        engine.generate(prompts[:4], params)  # warm-up (CUDA graphs, allocator)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            tokens, seconds = timed(engine, prompts, params)
            rates[name].append(tokens / seconds)
    result["tokens_per_s"] = {name: [round(r) for r in v] for name, v in rates.items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
