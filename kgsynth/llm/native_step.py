"""A small Llama's decode step and sampling loop as native calls (``decode_step.c``,
``decode_loop.c``), built on first use.

:class:`~kgsynth.llm.kv_llama.KVLlama` runs a step of one token a row through torch as some
forty small operations; for a policy of a few hundred thousand parameters each costs more in
dispatch than in arithmetic, and the attention's batched products read every slot of the
cache, filled or not. :func:`load` compiles the two sources with the system's C compiler
(once per machine, kept under the user's cache folder, named by the sources' and the CPU's
hash) and :class:`NativeStep` runs the whole step there (a block of rows through every layer
together, each row's attention over its filled slots only, the rows split over torch's thread
count), and, with :meth:`NativeStep.loop`, the sampling loop too.

It is used only where its arithmetic is the module's: float32 weights on a CPU, SiLU, no
biases, a cache whose rows are laid out as ``KVLlama`` lays them. No compiler, a failed
build, another platform, or ``KGSYNTH_NATIVE=0``: :func:`load` returns None and the torch
step runs (the same function, slower). The logits agree with the torch step's to float32
rounding (``tests/test_native_step.py``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = (HERE / "decode_step.c", HERE / "decode_loop.c")  # and the header they share
HEADER = HERE / "decode_step.h"
# -ffast-math lets the compiler vectorize the sums and expf (glibc's vector maths); it is
# given to the compile only, so the link does not add the startup code that would switch
# the whole process's floating point to flush-to-zero
COMPILE = ("-O3", "-ffast-math", "-fno-finite-math-only", "-fPIC", "-pthread")
LINK = ("-shared", "-pthread")
# the instruction set: this CPU's (AVX-512 loops where it has them, portable C elsewhere);
# KGSYNTH_NATIVE_ARCH=x86-64 builds the portable loops anywhere (the tests check both)
ARCH_ENV = "KGSYNTH_NATIVE_ARCH"


def _cpu_signature() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    model = next((ln for ln in text.splitlines() if ln.startswith("model name")), "")
    return model + flags


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kgsynth" / "native"


def _flags() -> tuple[str, ...]:
    return (*COMPILE, f"-march={os.environ.get(ARCH_ENV) or 'native'}")


def _build(target: Path, compiler: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objs = [Path(tmp) / f"{src.stem}.o" for src in SOURCES]
        lib = Path(tmp) / target.name
        cmds = [
            [compiler, *_flags(), "-c", str(src), "-o", str(obj)]
            for src, obj in zip(SOURCES, objs, strict=True)
        ]
        cmds.append([compiler, *LINK, *map(str, objs), "-o", str(lib), "-lm"])
        for cmd in cmds:
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        os.replace(lib, target)  # atomic: a concurrent builder finds a whole library or none


@cache
def load() -> Any:
    """The compiled library, or None where it cannot be had (see the module docstring)."""
    if os.environ.get("KGSYNTH_NATIVE", "1") == "0" or sys.platform != "linux":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not all(p.exists() for p in (*SOURCES, HEADER)):
        return None
    text = b"".join(p.read_bytes() for p in (*SOURCES, HEADER))
    key = hashlib.sha256(
        text + " ".join(_flags() + LINK).encode() + _cpu_signature().encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"decode_step-{key}.so"
    try:
        if not target.exists():
            _build(target, compiler)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as e:
        log.info("the native decode step is not available (%s); torch runs it", e)
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.kg_decode_step.restype = ctypes.c_int
    lib.kg_decode_step.argtypes = [ctypes.c_int] * 10 + [p] * 11 + [i64, i64, ctypes.c_float, p]
    lib.kg_decode_step.argtypes += [ctypes.c_int]
    f = ctypes.c_float
    lib.kg_decode_loop.restype = ctypes.c_int
    lib.kg_decode_loop.argtypes = (
        [ctypes.c_int] * 9 + [p] * 8 + [i64, i64, f] + [p] * 6 + [ctypes.c_int, p, f, p, p]
    )
    lib.kg_decode_loop.argtypes += [ctypes.c_int]
    return lib


def _ptr(t: Any) -> int:
    return t.data_ptr()


class NativeStep:
    """The decode step of one ``KVLlama`` (see the module docstring). :meth:`bind` after each
    of the llama's own binds (it reads the weights then); :meth:`step` runs one step, or
    returns None where this step is not one it runs as torch would."""

    def __init__(self, llama: Any, lib: Any) -> None:
        self.llama, self.lib = llama, lib
        self._keep: list[Any] = []  # the transposed weights the pointers point into
        self._ptrs: Any = None

    @staticmethod
    def supports(llama: Any) -> bool:
        """Whether the native step computes this model's decode step as torch does."""
        import torch

        m = llama.model
        c = m.config
        biases = [
            getattr(proj, "bias", None)
            for layer in m.model.layers
            for proj in (
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
                layer.self_attn.o_proj,
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
                layer.mlp.down_proj,
            )
        ]
        return (
            llama.device.type == "cpu"
            and llama.dtype == torch.float32
            and getattr(c, "hidden_act", None) == "silu"
            and llama.n_heads % llama.n_kv == 0
            and llama.head_dim <= 256
            and all(b is None for b in biases)
            and m.model.embed_tokens.weight.shape[0] == m.lm_head.weight.shape[0]
        )

    def bind(self) -> bool:
        """Take the llama's bound weights, transposed for the native loops; False when this
        model is not one the native step runs."""
        if not self.supports(self.llama):
            self._ptrs = None
            return False
        keep = []
        for w in self.llama.layers:
            keep += [
                w["ln1"].contiguous(),
                w["qkv"].t().contiguous(),
                w["o"].t().contiguous(),
                w["ln2"].contiguous(),
                w["gate_up"].t().contiguous(),
                w["down"].t().contiguous(),
            ]
        m = self.llama.model
        self._embed = m.model.embed_tokens.weight.detach().contiguous()
        self._norm = m.model.norm.weight.detach().contiguous()
        self._head = m.lm_head.weight.detach().t().contiguous()
        self._cos = self.llama._cos.contiguous()
        self._sin = self.llama._sin.contiguous()
        self._keep = keep
        self._ptrs = (ctypes.c_void_p * len(keep))(*[_ptr(t) for t in keep])
        self.inter = int(keep[4].shape[1]) // 2
        return True

    def _runs(self, cache: Any) -> bool:
        """Bound, and ``cache`` laid out as the native loops read it (rows of
        ``[kv heads, capacity, head dim]``, keys and values alike, within the rotary tables)."""
        k, v = cache.k, cache.v
        cap, D = k.shape[3], k.shape[4]
        return (
            self._ptrs is not None
            and k.stride() == v.stride()
            and k.stride()[2:] == (cap * D, D, 1)
            and cap <= self._cos.shape[0]
        )

    def step(self, cache: Any, ids: Any, start: Any, valid: Any) -> Any:
        """Run ``ids`` ``[B, T]`` (row b's first ``valid[b]``) at positions ``start[b]``…, a
        token at a time, their keys and values written into ``cache``: the logits
        ``[B, vocab]`` at each row's last token, as :meth:`KVLlama.forward` returns them. None
        when the cache's layout is not the native loops' or an id or a position is out of
        range (the caller runs torch, which says what is wrong)."""
        import torch

        k, v = cache.k, cache.v
        L, B, KV, cap, D = k.shape
        if not self._runs(cache):
            return None
        ids = ids.to(torch.int64).contiguous()
        start = start.to(torch.int64).contiguous()
        valid = valid.to(torch.int64).contiguous()
        H, V = int(self._embed.shape[1]), int(self._head.shape[1])
        logits = torch.empty((B, V), dtype=torch.float32)
        failed = self.lib.kg_decode_step(
            *(B, L, H, self.llama.n_heads, KV, D, self.inter, V, cap, int(ids.shape[1])),
            *(_ptr(ids), _ptr(start), _ptr(valid), _ptr(self._embed)),
            ctypes.cast(self._ptrs, ctypes.c_void_p),
            *(_ptr(self._norm), _ptr(self._head), _ptr(self._cos), _ptr(self._sin)),
            *(_ptr(k), _ptr(v), k.stride(0), k.stride(1), self.llama.eps, _ptr(logits)),
            torch.get_num_threads(),
        )
        return None if failed else logits

    def loop(self, cache: Any, state: LoopState) -> None:
        """Decode ``state``'s rows (row i is cache row i) until each is done or waits (see
        :class:`LoopState`); raises where the native loop cannot run them (a layout it does
        not know, or rows that would run past the cache: a caller's error)."""
        import torch

        k, v = cache.k, cache.v
        L, B, KV, cap, D = k.shape
        if not self._runs(cache):
            raise ValueError("the native loop needs a bound model and a KVLlama cache")
        H, V = int(self._embed.shape[1]), int(self._head.shape[1])
        for threads in (torch.get_num_threads(), 1):
            failed = self.lib.kg_decode_loop(
                *(B, L, H, self.llama.n_heads, KV, D, self.inter, V, cap),
                *(_ptr(self._embed), ctypes.cast(self._ptrs, ctypes.c_void_p), _ptr(self._norm)),
                *(_ptr(self._head), _ptr(self._cos), _ptr(self._sin), _ptr(k), _ptr(v)),
                *(k.stride(0), k.stride(1), self.llama.eps),
                *(_ptr(state.logits), _ptr(state.lens), _ptr(state.state), _ptr(state.toks)),
                *(_ptr(state.lps), _ptr(state.n_out), state.room),
                state.u.data_ptr() if state.u is not None else None,
                state.temperature,
                *(_ptr(state.is_stop), _ptr(state.is_cand), threads),
            )
            if failed == 2:
                raise ValueError("the native decode loop was given rows past their cache")
            if not failed:
                return
        raise MemoryError("the native decode loop could not get its memory")


class LoopState:
    """The rows of :meth:`NativeStep.loop`, as tensors the native loop reads and writes: each
    row's ``state`` (``SAMPLE``: its next logits are in ``logits``; ``FEED``: its last sampled
    token is to run; ``WAIT``: it sampled a token in ``is_cand`` and waits for the caller to
    check its stop strings and set it ``DONE`` or ``FEED``; ``DONE``: a stop id or
    ``room`` tokens), its next position ``lens``, and what it sampled (``toks``, ``lps``,
    ``n_out``). ``u``: one uniform draw a row and token (None at temperature 0)."""

    SAMPLE, FEED, WAIT, DONE = 0, 1, 2, 3

    def __init__(
        self,
        logits: Any,
        lens: Any,
        room: int,
        temperature: float,
        stop_ids: Any,
        candidates: Any,
    ) -> None:
        import torch

        B, V = logits.shape
        self.room, self.temperature = room, float(max(0.0, temperature))
        self.logits = logits.to(torch.float32).contiguous().clone()
        self.lens = lens.to(torch.int64).contiguous().clone()
        self.state = torch.zeros(B, dtype=torch.int8)
        self.toks = torch.zeros((B, room), dtype=torch.int64)
        self.lps = torch.zeros((B, room), dtype=torch.float32)
        self.n_out = torch.zeros(B, dtype=torch.int64)
        self.u = torch.rand((B, room)) if self.temperature > 0 else None
        self.is_stop = torch.zeros(V, dtype=torch.uint8)
        if len(stop_ids):
            self.is_stop[stop_ids.cpu()] = 1
        self.is_cand = torch.zeros(V, dtype=torch.uint8)
        if candidates is not None:
            self.is_cand[candidates.cpu()] = 1


__all__ = ["LoopState", "NativeStep", "load"]
