"""A Llama forward over a preallocated KV cache, for batched decoding of small models.

A transformers ``LlamaForCausalLM`` (its live parameters) → :class:`KVLlama`, whose
:meth:`~KVLlama.forward` runs new tokens of a batch on top of what each row already holds in
a :class:`KVCache` ``[layers, batch, kv heads, capacity, head dim]``: each row's tokens start
at slot 0 (no padding gaps; a row's position is its slot), a step writes its keys and values
at each row's own length and attends over the filled part only. The same function prefills a
prompt batch (``T`` new tokens per row, right-padded) and decodes (``T`` = 1).

    llama = KVLlama(model)            # refuses other architectures in one line
    cache = llama.new_cache(batch=64, capacity=1024)
    logits = llama.forward(cache, ids, start, valid)  # [batch, vocab] at each row's last token

The arithmetic is transformers' own (RMSNorm in float32, rotary tables from the model's own
rotary module, so ``rope_theta`` and the static scalings match), in the model's dtype.
Weights are read from the module at every :meth:`~KVLlama.bind`, so they never go stale.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

# rotary types whose tables depend on the sequence length seen so far: not supported here
_DYNAMIC_ROPE = ("dynamic", "longrope")
SUPPORTED = ("llama",)


class UnsupportedModel(ValueError):
    """The model is not one :class:`KVLlama` can run (its architecture, adapters, shards)."""


@dataclass
class KVCache:
    """Keys and values of ``batch`` rows, ``capacity`` positions each."""

    k: Any  # [layers, batch, kv heads, capacity, head dim]
    v: Any

    @property
    def capacity(self) -> int:
        return int(self.k.shape[3])


def check_model(model: Any) -> None:
    """Raise :class:`UnsupportedModel` (one line: the architecture and the engines that run
    it) unless ``model`` is a plain, whole transformers Llama causal LM."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", type(model).__name__)
    if hasattr(model, "peft_config"):
        raise UnsupportedModel(
            "the static engine runs plain Llama models, not LoRA-wrapped ones "
            "(merge the adapter with kgsynth train merge, or use the hf engine)"
        )
    if kind not in SUPPORTED or not hasattr(getattr(model, "model", None), "layers"):
        raise UnsupportedModel(
            f"the static engine runs Llama-architecture models only (this one is {kind!r}); "
            "use the hf engine (or vllm on a GPU)"
        )
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        raise UnsupportedModel("the static engine needs whole weights, not DeepSpeed ZeRO-3 shards")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) in _DYNAMIC_ROPE:
        raise UnsupportedModel(
            f"the static engine has no {rope.get('rope_type')!r} rotary scaling; use the hf engine"
        )


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux


def _zeros_on_huge_pages(shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """A zeroed tensor whose memory the kernel is asked (before it is first touched) to back
    with 2 MB pages: a decode step reads the whole cache, tens of MB, and with 4 kB pages
    its TLB misses cost ~8 % of a step on a CPU. Elsewhere (other systems, a GPU, a kernel
    that says no) a plain zeroed tensor."""
    import torch

    out = torch.empty(shape, dtype=dtype, device=device)
    size = out.element_size() * out.nelement()
    if out.device.type == "cpu" and sys.platform == "linux" and size >= 2 * _HUGE_PAGE:
        start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE  # the aligned part inside
        length = (out.data_ptr() + size - start) // _HUGE_PAGE * _HUGE_PAGE
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_HUGEPAGE)
    return out.zero_()


class KVLlama:
    """The forward of a Llama module over a :class:`KVCache` (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        from transformers.activations import ACT2FN

        check_model(model)
        self.model = model
        c = model.config
        self.n_layers = int(c.num_hidden_layers)
        self.n_heads = int(c.num_attention_heads)
        self.n_kv = int(getattr(c, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // self.n_heads)
        self.eps = float(c.rms_norm_eps)
        self.act = ACT2FN[c.hidden_act]
        self.layers: list[dict[str, Any]] = []
        self._cos: Any = None
        self._sin: Any = None
        self._buffers: list[Any] = [None, None]  # the keys' and the values' memory
        self._native: Any = None  # the fused decode step (native_step.py), where it runs
        self.use_native = True

    @property
    def device(self) -> Any:
        return self.model.model.embed_tokens.weight.device

    @property
    def dtype(self) -> Any:
        return self.model.model.embed_tokens.weight.dtype

    def bind(self, capacity: int) -> None:
        """Read the module's current weights (fusing q/k/v and gate/up, a few small copies)
        and the rotary tables for ``capacity`` positions: once per generate call."""
        import torch

        with torch.no_grad():
            self.layers = []
            for layer in self.model.model.layers:
                a, m = layer.self_attn, layer.mlp
                bias = None
                if a.q_proj.bias is not None:
                    bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                self.layers.append(
                    {
                        "ln1": layer.input_layernorm.weight,
                        "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                        "qkv_bias": bias,
                        "o": a.o_proj.weight,
                        "o_bias": a.o_proj.bias,
                        "ln2": layer.post_attention_layernorm.weight,
                        "gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                        "down": m.down_proj.weight,
                        "mlp_bias": None
                        if m.gate_proj.bias is None
                        else (torch.cat([m.gate_proj.bias, m.up_proj.bias]), m.down_proj.bias),
                    }
                )
            if self._cos is None or self._cos.shape[0] < capacity:
                pos = torch.arange(capacity, device=self.device)[None]
                probe = torch.empty(1, dtype=self.dtype, device=self.device)
                cos, sin = self.model.model.rotary_emb(probe, pos)
                self._cos, self._sin = cos[0], sin[0]  # [capacity, head dim]
        self._bind_native()

    def native(self) -> bool:
        """Whether decode steps run natively (:mod:`kgsynth.llm.native_step`) for this model
        on this machine."""
        from kgsynth.llm import native_step

        if not self.use_native or native_step.load() is None:
            return False
        return native_step.NativeStep.supports(self)

    def _bind_native(self) -> None:
        from kgsynth.llm import native_step

        lib = native_step.load() if self.use_native else None
        if lib is None:
            self._native = None
            return
        if self._native is None:
            self._native = native_step.NativeStep(self, lib)
        if not self._native.bind():
            self._native = None

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """A zeroed cache. Its memory is this object's, reused from call to call (its pages
        stay mapped, on 2 MB pages where the system allows): a new cache ends the last one."""
        import math

        shape = (self.n_layers, batch, self.n_kv, capacity, self.head_dim)
        n = math.prod(shape)
        for i, buf in enumerate(self._buffers):
            if buf is None or buf.nelement() < n or buf.dtype != self.dtype:
                self._buffers[i] = None  # the old one is freed before the new one is taken
                self._buffers[i] = _zeros_on_huge_pages((n,), self.dtype, self.device)
        k, v = (buf[:n].view(shape).zero_() for buf in self._buffers)
        return KVCache(k, v)

    def _norm(self, x: Any, w: Any) -> Any:
        import torch
        import torch.nn.functional as F

        if x.dtype == torch.float32:  # one fused op, the same arithmetic
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * h.to(x.dtype)

    def _rope(self, x: Any, cos: Any, sin: Any) -> Any:
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, cache: KVCache, ids: Any, start: Any, valid: Any) -> Any:
        """Run ``ids`` ``[B, T]`` (row b's first ``valid[b]`` are real, the rest padding) at
        positions ``start[b]``…; their keys and values go into ``cache`` there. Returns the
        logits ``[B, vocab]`` (float32) at each row's last real token. ``start + T`` must fit
        the cache; a padding token's slot is overwritten by the row's next real token."""
        import torch
        import torch.nn.functional as F

        B, T = ids.shape
        if self._native is not None:
            logits = self._native.step(cache, ids, start, valid)
            if logits is not None:
                return logits
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        pos = start[:, None] + torch.arange(T, device=ids.device)[None]  # [B, T]
        cos, sin = self._cos[pos][:, :, None], self._sin[pos][:, :, None]  # [B, T, 1, D]
        if T == 1:
            attend = self._decode_attention(cache, start)
        else:
            attend = self._prefill_attention(cache, pos)
        h = self.model.model.embed_tokens.weight[ids]  # [B, T, hidden]
        for i, w in enumerate(self.layers):
            x = self._norm(h, w["ln1"])
            qkv = F.linear(x, w["qkv"], w["qkv_bias"])
            # queries and keys rotated together
            qk = self._rope(qkv[..., : (H + KV) * D].view(B, T, H + KV, D), cos, sin)
            q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
            v = qkv[..., (H + KV) * D :].view(B, T, KV, D).transpose(1, 2)
            att = attend(i, q, k, v)
            h = h + F.linear(att.transpose(1, 2).reshape(B, T, H * D), w["o"], w["o_bias"])
            x = self._norm(h, w["ln2"])
            gb = w["mlp_bias"]
            gate, up = F.linear(x, w["gate_up"], None if gb is None else gb[0]).chunk(2, dim=-1)
            h = h + F.linear(self.act(gate) * up, w["down"], None if gb is None else gb[1])
        last = h[torch.arange(B, device=ids.device), valid - 1]  # [B, hidden]
        last = self._norm(last, self.model.model.norm.weight)
        return F.linear(last, self.model.lm_head.weight).float()

    def _prefill_attention(self, cache: KVCache, pos: Any) -> Any:
        """Attention of ``T`` new tokens a row over the filled part of the cache."""
        import torch
        import torch.nn.functional as F

        B, T = pos.shape
        width = int(pos[:, -1].max()) + 1
        # a query sees every key at or before its own position (an additive mask, built once
        # for every layer)
        later = torch.arange(width, device=pos.device)[None, None, :] > pos[:, :, None]
        bias = torch.zeros(later.shape, dtype=self.dtype, device=pos.device)
        bias = bias.masked_fill_(later, -float("inf"))[:, None]
        rows = torch.arange(B, device=pos.device)[:, None].expand(B, T)

        def attend(i: int, q: Any, k: Any, v: Any) -> Any:
            cache.k[i][rows, :, pos] = k.transpose(1, 2)
            cache.v[i][rows, :, pos] = v.transpose(1, 2)
            return F.scaled_dot_product_attention(
                q,
                cache.k[i][:, :, :width],
                cache.v[i][:, :, :width],
                attn_mask=bias,
                scale=self.head_dim**-0.5,
                enable_gqa=self.n_kv != self.n_heads,
            )

        return attend

    def _decode_attention(self, cache: KVCache, start: Any) -> Any:
        """Attention of one new token a row over the whole cache (a fixed shape, contiguous:
        faster on a CPU than a slice of it), the empty slots masked out."""
        import torch

        B, KV, cap, D = cache.k.shape[1:]
        group = self.n_heads // KV
        slots = torch.arange(cap, device=start.device)
        bias = torch.zeros((B, 1, 1, cap), dtype=self.dtype, device=start.device)
        bias.masked_fill_(slots[None, None, None, :] > start[:, None, None, None], -float("inf"))
        # the new key's row in the cache seen as [B * KV * cap, D]
        rows = torch.arange(B * KV, device=start.device).view(B, KV) * cap + start[:, None]
        rows = rows.flatten()
        scale = D**-0.5

        def attend(i: int, q: Any, k: Any, v: Any) -> Any:
            cache.k[i].view(-1, D).index_copy_(0, rows, k.reshape(B * KV, D))
            cache.v[i].view(-1, D).index_copy_(0, rows, v.reshape(B * KV, D))
            # a group's query heads as the rows of one product with their key-value head
            qg = q.reshape(B, KV, group, D) * scale
            scores = torch.matmul(qg, cache.k[i].transpose(-1, -2)).add_(bias)
            out = torch.matmul(torch.softmax(scores, dim=-1), cache.v[i])  # [B, KV, group, D]
            return out.reshape(B, self.n_heads, 1, D)

        return attend


__all__ = ["SUPPORTED", "KVCache", "KVLlama", "UnsupportedModel", "check_model"]
