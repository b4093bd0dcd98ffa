"""A Llama checkpoint's weights as the static engine reads them, without transformers' modelling.

The static engine (:mod:`kgsynth.llm.kv_llama`) reads a Llama model's parameters by their
module paths (``model.layers[i].self_attn.q_proj.weight``, ...) and its rotary tables from
``model.model.rotary_emb``; it never runs the module. Building ``LlamaForCausalLM`` to hold
those tensors means importing transformers' modelling packages, about 1 s of every
``kgsynth eval`` on this machine (benchmarks/README.md, "Eval in 15 s"). :func:`load_light_llama`
builds the same module paths from ``model.safetensors`` directly, with the default rotary
table computed as transformers computes it, so the decoder gives the same logits bit for bit
(``tests/test_light_llama.py``). It takes only what it can hold exactly: :func:`refusal` says
why a checkpoint needs the real class (another architecture, a rotary scaling, sharded or
quantized weights, a tensor it does not know), and the caller loads that instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

WEIGHTS = "model.safetensors"
_PROJ = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}
_NORMS = ("input_layernorm", "post_attention_layernorm")


def _config(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text(encoding="utf-8"))


def refusal(path: str | Path) -> str | None:
    """Why the checkpoint in ``path`` needs transformers' own class, or None when
    :func:`load_light_llama` holds it exactly."""
    path = Path(path)
    try:
        c = _config(path)
    except (OSError, ValueError) as exc:
        return f"config.json unreadable ({exc})"
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    checks = {
        "not a Llama model": c.get("model_type") != "llama",
        "quantized weights": "quantization_config" in c,
        "a rotary scaling": rope.get("rope_type", rope.get("type", "default")) != "default",
        "weights not in one model.safetensors": not (path / WEIGHTS).is_file()
        or (path / f"{WEIGHTS}.index.json").exists(),
    }
    return next((why for why, bad in checks.items() if bad), None)


def _param(tensor: Any) -> Any:
    import torch

    return torch.nn.Parameter(tensor, requires_grad=False)


def _holder(**tensors: Any) -> Any:
    """A module holding ``tensors`` as its parameters (None: an absent bias)."""
    import torch

    module = torch.nn.Module()
    for name, tensor in tensors.items():
        setattr(module, name, None if tensor is None else _param(tensor))
    return module


class DefaultRotary:
    """transformers' default Llama rotary table: ``rotary(probe, positions)`` → ``(cos, sin)``
    ``[batch, positions, head dim]`` in the probe's dtype, computed with the same operations."""

    def __init__(self, head_dim: int, theta: float) -> None:
        import torch

        steps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float)
        self.inv_freq = 1.0 / (theta ** (steps / head_dim))

    def __call__(self, probe: Any, positions: Any) -> tuple[Any, Any]:
        import torch

        inv = self.inv_freq.to(positions.device)[None, :, None].float()
        inv = inv.expand(positions.shape[0], -1, 1)
        freqs = (inv.float() @ positions[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(probe.dtype), emb.sin().to(probe.dtype)


def load_light_llama(path: str | Path, dtype: Any = None) -> Any:
    """The checkpoint in ``path`` (one :func:`refusal` passes) as a module with Llama's
    parameter paths, ``config``, ``generation_config`` and rotary table; ValueError when its
    weights hold a tensor that has no place here."""
    import torch
    from safetensors.torch import load_file
    from transformers import GenerationConfig

    path = Path(path)
    raw = _config(path)
    state = load_file(str(path / WEIGHTS))
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    config = SimpleNamespace(**raw)
    n_heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or raw["hidden_size"] // n_heads)
    rope = raw.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    used: set[str] = set()

    def take(key: str, optional: bool = False) -> Any:
        if key not in state:
            if optional:
                return None
            raise ValueError(f"{path / WEIGHTS}: no tensor {key}")
        used.add(key)
        return state[key]

    model = torch.nn.Module()
    model.config = config
    model.model = torch.nn.Module()
    model.model.embed_tokens = _holder(weight=take("model.embed_tokens.weight"))
    layers = []
    for i in range(int(raw["num_hidden_layers"])):
        layer = torch.nn.Module()
        prefix = f"model.layers.{i}"
        for part, names in _PROJ.items():
            block = torch.nn.Module()
            for name in names:
                key = f"{prefix}.{part}.{name}"
                setattr(block, name, _holder(weight=take(f"{key}.weight"),
                                             bias=take(f"{key}.bias", optional=True)))  # fmt: skip
            setattr(layer, part, block)
        for name in _NORMS:
            setattr(layer, name, _holder(weight=take(f"{prefix}.{name}.weight")))
        layers.append(layer)
    model.model.layers = torch.nn.ModuleList(layers)
    model.model.norm = _holder(weight=take("model.norm.weight"))
    model.model.rotary_emb = DefaultRotary(head_dim, theta)
    head = take("lm_head.weight", optional=raw.get("tie_word_embeddings", False))
    model.lm_head = _holder(weight=model.model.embed_tokens.weight if head is None else head)
    unknown = sorted(set(state) - used)
    if unknown:
        raise ValueError(
            f"{path / WEIGHTS}: tensors the light loader has no place for: {unknown[:3]}"
        )
    model.generation_config = GenerationConfig.from_pretrained(str(path))
    return model.eval()
