"""The control for a GRPO run's weight change (issue 46 item 3): the start's weights moved
as far as the run moved them, tensor by tensor, but in a random direction.

For each parameter tensor, ``delta = END - START`` of the run; the control adds to START a
Gaussian tensor of the same shape scaled to ``|delta|`` (or, with ``--shuffle``, delta's own
entries permuted within the tensor: the same values, no direction). Evaluate the folder it
writes on the validation questions as the GRPO checkpoint was: if the control loses as many
questions as the run, the run's update did no better than a random step of its size::

    .venv/bin/python benchmarks/grpo_perturb.py runs/i43d/stage2 runs/g46/A/checkpoints/step-60 \\
        runs/g46/control_A --seed 0
    kgsynth eval --config metaqa_default --section eval --model runs/g46/control_A ...
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("start", type=Path, help="the run's start (a model folder)")
    parser.add_argument("end", type=Path, help="the run's checkpoint (a model folder)")
    parser.add_argument("out", type=Path, help="the control model folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shuffle", action="store_true", help="permute delta's entries")
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file, save_file

    start = load_file(args.start / "model.safetensors")
    end = load_file(args.end / "model.safetensors")
    if set(start) != set(end):
        raise SystemExit(f"{args.start} and {args.end} hold different tensors")
    gen = torch.Generator().manual_seed(args.seed)
    out, moved = {}, 0.0
    for name, w in start.items():
        delta = end[name].float() - w.float()
        if args.shuffle:
            flat = delta.flatten()
            step = flat[torch.randperm(flat.numel(), generator=gen)].view_as(delta)
        else:
            noise = torch.randn(delta.shape, generator=gen)
            step = noise * (delta.norm() / noise.norm().clamp(min=1e-12))
        out[name] = (w.float() + step).to(w.dtype).contiguous()
        moved += float(delta.norm() ** 2)
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(args.start, args.out, ignore=shutil.ignore_patterns("checkpoints"))
    save_file(out, args.out / "model.safetensors", metadata={"format": "pt"})
    print(f"{args.out}: start + a random step of |delta| {moved**0.5:.4f} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
