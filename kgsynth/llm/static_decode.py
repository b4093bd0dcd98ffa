"""Batched decoding of a small Llama with a preallocated KV cache and a prefix cache.

Token ids in, sampled ids and their log-probs out, as transformers' ``generate`` samples them
(the same logits processors: temperature, then top-p; ``argmax`` at temperature 0; with
``exact_rng`` also the same ``torch.multinomial`` draw over the whole batch per step, so a
seeded run samples the very tokens ``generate`` samples), but each step is one :meth:`~kgsynth.llm.kv_llama.KVLlama.forward` of fixed shape ``[B, 1]``
that writes its keys and values in place instead of growing a cache.

The keys and values of every sequence decoded are kept (:class:`PrefixStore`, up to a memory
budget, least recently used first out): a prompt that begins with a sequence seen before (the
next turn of an agent episode: its previous prompt, the sampled turn, the observation) starts
from those keys and values and prefills only its new tokens. A prompt is matched by its
tokens, never by a name, so what is reused is always exact; the store is emptied whenever
the model's weights change (an optimizer step, a load), which is read from the parameters'
version counters at every call.

    decoder = StaticDecoder(model, tokenizer)
    outs = decoder.generate([[1, 2, 3]], DecodeParams(max_new_tokens=16, temperature=1.0))
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.llm.kv_llama import KVCache, KVLlama

log = logging.getLogger(__name__)

BLOCK = 16  # prompts are matched to stored sequences a block of tokens at a time


@dataclass(frozen=True)
class DecodeParams:
    """At most ``max_new_tokens`` at ``temperature`` (0: greedy), the ``top_k`` likeliest
    tokens (0: all) and nucleus ``top_p``; a row
    stops after any of ``stop_ids`` or once its sampled text ends with one of ``stop_strings``."""

    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    stop_strings: tuple[str, ...] = ()


@dataclass
class Decoded:
    """One prompt's sampled ids, their log-probs, and the prompt tokens the prefix cache
    supplied (not prefilled again)."""

    ids: list[int]
    logprobs: list[float]
    reused: int = 0


@dataclass
class _Entry:
    ids: Any  # numpy int64 [n]
    k: Any  # [layers, kv heads, n, head dim]
    v: Any
    hashes: list[int]

    @property
    def nbytes(self) -> int:
        return int(self.k.element_size() * self.k.nelement() * 2)


class _Run:
    """One generate call's rows while they decode: the prompts, their store matches, the
    cache (whose row i is the call's row ``rows[i]``) and what each row sampled."""

    def __init__(
        self,
        arrays: list[Any],
        found: list,
        reuse: list[int],
        cache: KVCache,
        room: int,
        device: Any,
    ) -> None:
        import torch

        B = len(arrays)
        self.arrays, self.found, self.reuse, self.cache = arrays, found, reuse, cache
        self.rows = torch.arange(B, device=device)
        self.toks = torch.zeros((B, room), dtype=torch.long, device=device)
        self.lps = torch.zeros((B, room), dtype=torch.float32, device=device)
        self.n_out = torch.zeros(B, dtype=torch.long, device=device)
        self.fed = 0  # tokens a live row has fed back into the cache
        self.fed_rows: dict[int, int] | None = None  # the same, row by row (the native loop)


def _block_hashes(ids: Any, n: int) -> list[int]:
    """A chained hash of each whole block of ``ids[:n]``: the i-th names the first i+1 blocks."""
    out, h = [], 0
    for start in range(0, n - BLOCK + 1, BLOCK):
        h = hash((h, ids[start : start + BLOCK].tobytes()))
        out.append(h)
    return out


class PrefixStore:
    """Keys and values of earlier sequences, found by their longest shared prefix."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self.by_hash: dict[int, dict[int, None]] = {}
        self.used = 0
        self._next = 0

    def clear(self) -> None:
        self.entries.clear()
        self.by_hash.clear()
        self.used = 0

    def lookup(self, ids: Any) -> tuple[int | None, int]:
        """The stored entry sharing the longest prefix with ``ids`` and that prefix's length
        (exact: compared token by token)."""
        import numpy as np

        best = None
        for h in _block_hashes(ids, len(ids)):
            found = self.by_hash.get(h)
            if not found:
                break
            best = next(reversed(found))
        if best is None:
            return None, 0
        stored = self.entries[best].ids
        m = min(len(stored), len(ids))
        diff = np.flatnonzero(stored[:m] != ids[:m])
        self.entries.move_to_end(best)
        return best, int(diff[0]) if len(diff) else m

    def add(self, ids: Any, k: Any, v: Any) -> None:
        key, self._next = self._next, self._next + 1
        entry = _Entry(ids, k, v, _block_hashes(ids, len(ids)))
        self.entries[key] = entry
        for h in entry.hashes:
            self.by_hash.setdefault(h, {})[key] = None
        self.used += entry.nbytes
        while self.used > self.budget and self.entries:
            self.remove(next(iter(self.entries)))

    def remove(self, key: int) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self.used -= entry.nbytes
        for h in entry.hashes:
            found = self.by_hash.get(h)
            if found is not None:
                found.pop(key, None)
                if not found:
                    del self.by_hash[h]


class StaticDecoder:
    """Batched sampling from a Llama module's live weights (see the module docstring).
    ``cache_bytes`` bounds the prefix cache (0: none); ``exact_rng`` draws each token with
    ``torch.multinomial`` as ``generate`` does (the same tokens from the same seed), else
    with a cheaper draw from the same distribution (:func:`_sample`)."""

    def __init__(
        self, model: Any, tokenizer: Any, *, cache_bytes: int = 1 << 30, exact_rng: bool = False
    ) -> None:
        self.llama = KVLlama(model)
        self.exact_rng = exact_rng
        self.model = model
        self.tok = tokenizer
        self.store = PrefixStore(cache_bytes)
        self._signature: Any = None
        self._candidates: dict[tuple[str, ...], Any] = {}
        # decode_steps: forwards of one token a row; row_steps: the rows they ran
        self.stats = dict.fromkeys(
            ("prompt_tokens", "reused_tokens", "generated_tokens", "decode_steps", "row_steps"), 0
        )

    def weights_changed(self) -> None:
        """Forget every stored prefix (its keys and values came from other weights)."""
        self.store.clear()
        self._signature = None

    def _check_weights(self) -> None:
        sig = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if sig != self._signature:
            self.store.clear()
            self._signature = sig

    def generate(self, prompts: Sequence[Sequence[int]], params: DecodeParams) -> list[Decoded]:
        """One completion per prompt, in order; each ends at its first stop (kept) or after
        ``max_new_tokens``."""
        import torch

        if params.max_new_tokens < 1 or not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs non-empty prompts and max_new_tokens >= 1")
        self._check_weights()
        with torch.inference_mode():
            return self._generate(prompts, params)

    def _generate(self, prompts: Sequence[Sequence[int]], params: DecodeParams) -> list[Decoded]:
        import numpy as np

        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        self._share_prefix(arrays)
        run, logits, lens = self._prefill(arrays, params.max_new_tokens)
        self._decode(run, logits, lens, params)
        self.stats["prompt_tokens"] += sum(len(a) for a in arrays)
        self.stats["reused_tokens"] += sum(run.reuse)
        toks, lps, n_out = run.toks.cpu(), run.lps.cpu(), run.n_out.tolist()
        self.stats["generated_tokens"] += sum(n_out)
        return [
            Decoded(toks[b, :n].tolist(), [min(0.0, v) for v in lps[b, :n].tolist()], r)
            for b, (n, r) in enumerate(zip(n_out, run.reuse, strict=True))
        ]

    def _prefill(self, arrays: list[Any], room: int) -> tuple[_Run, Any, Any]:
        """Each prompt's longest stored prefix copied into a new cache with ``room`` free
        slots a row, the rest of it run: the call's rows, the logits at each prompt's last
        token and each row's length. Rows are ordered by the tokens they run, longest first,
        and run in groups of similar length when that saves padding."""
        import torch

        device = self.llama.device
        found = [self.store.lookup(a) for a in arrays]
        # at least the last prompt token is run: its logits give the first sample
        reuse = [min(n, len(a) - 1) for a, (_, n) in zip(arrays, found, strict=True)]
        new = [len(a) - r for a, r in zip(arrays, reuse, strict=True)]
        # exact_rng draws over the rows in the caller's order: no reordering then
        order = sorted(range(len(arrays)), key=lambda b: 0 if self.exact_rng else -new[b])
        capacity = max(reuse) + max(new) + room
        self.llama.bind(capacity)
        run = _Run(arrays, found, reuse, self.llama.new_cache(len(arrays), capacity), room, device)
        run.rows = torch.tensor(order, device=device)
        ids = torch.zeros((len(arrays), max(new)), dtype=torch.long)
        for i, b in enumerate(order):
            a, r, (key, _) = arrays[b], reuse[b], found[b]
            ids[i, : len(a) - r] = torch.from_numpy(a[r:])
            if r:
                entry = self.store.entries[key]
                run.cache.k[:, i, :, :r] = entry.k[:, :, :r]
                run.cache.v[:, i, :, :r] = entry.v[:, :, :r]
        start = torch.tensor([reuse[b] for b in order], device=device)
        valid = torch.tensor([new[b] for b in order], device=device)
        ids = ids.to(device)
        logits = []
        groups = [(0, len(order))] if self.exact_rng else _groups(valid.tolist(), start.tolist())
        for g0, g1 in groups:
            part = KVCache(run.cache.k[:, g0:g1], run.cache.v[:, g0:g1])
            width = int(valid[g0:g1].max())
            logits.append(self.llama.forward(part, ids[g0:g1, :width], start[g0:g1], valid[g0:g1]))
        return run, torch.cat(logits), start + valid

    def _share_prefix(self, arrays: list[Any]) -> None:
        """Prompts that begin alike (an episode's first turn: the system prompt) and are not
        stored: their shared beginning is run once, as one row, and stored, so each prompt
        prefills only what follows it."""
        if len(arrays) < 2 or self.store.budget <= 0:
            return
        first, n = arrays[0], min(len(a) for a in arrays) - 1
        for a in arrays[1:]:
            diff = (a[:n] != first[:n]).nonzero()[0]
            n = int(diff[0]) if len(diff) else n
        if n < 2 * BLOCK or n - self.store.lookup(first[:n])[1] < 2 * BLOCK:
            return
        run, _, _ = self._prefill([first[:n]], 0)
        self._retire(run, list(range(len(run.rows))))

    def _decode(self, run: _Run, logits: Any, lens: Any, params: DecodeParams) -> None:
        """The sampling loop, filling ``run``'s tokens. Unless the draws must be generate's
        own (``exact_rng``: one draw over the whole batch a step), a batch whose rows are
        half finished drops them (their keys and values go to the prefix store first)."""
        import torch

        if self._native_loop(params):
            return self._decode_native(run, logits, lens, params)
        device = logits.device
        finished = torch.zeros(len(run.rows), dtype=torch.bool, device=device)
        stop_ids = torch.tensor(sorted(params.stop_ids), dtype=torch.long, device=device)
        candidates = self._stop_candidates(params.stop_strings, logits.shape[1], device)
        for step in range(params.max_new_tokens):
            tok, lp = _sample(logits, params, self.exact_rng)
            run.toks[run.rows, step], run.lps[run.rows, step] = tok, lp
            run.n_out[run.rows] = torch.where(finished, run.n_out[run.rows], step + 1)
            stop = torch.isin(tok, stop_ids) if len(stop_ids) else torch.zeros_like(finished)
            if candidates is not None:
                stop |= self._stop_string_rows(run, step, tok, candidates, finished, params)
            finished |= stop
            if step + 1 == params.max_new_tokens or bool(finished.all()):
                break
            live = (~finished).nonzero().flatten()
            if not self.exact_rng and len(finished) >= 8 and 2 * len(live) <= len(finished):
                self._retire(run, finished.nonzero().flatten().tolist())
                run.cache = KVCache(run.cache.k[:, live], run.cache.v[:, live])
                run.rows, tok, lens, finished = (
                    run.rows[live],
                    tok[live],
                    lens[live],
                    finished[live],
                )
            logits = self.llama.forward(run.cache, tok[:, None], lens, torch.ones_like(lens))
            lens = lens + 1
            run.fed += 1
            self.stats["decode_steps"] += 1
            self.stats["row_steps"] += len(run.rows)
        self._retire(run, list(range(len(run.rows))))

    def _native_loop(self, params: DecodeParams) -> bool:
        """Whether the native loop samples this call: the native step is bound, no top-k or
        top-p, and no draw that must be generate's (greedy needs none)."""
        return (
            self.llama._native is not None
            and params.top_p >= 1.0
            and params.top_k == 0
            and (not self.exact_rng or params.temperature <= 0)
        )

    def _decode_native(self, run: _Run, logits: Any, lens: Any, params: DecodeParams) -> None:
        """The sampling loop in native code (:meth:`NativeStep.loop`): each row decoded to
        its stop id or its last token without a return to Python, except to check a stop
        string when a row samples a token that may end one."""
        import torch

        from kgsynth.llm.native_step import LoopState

        stop_ids = torch.tensor(sorted(params.stop_ids), dtype=torch.long)
        candidates = self._stop_candidates(params.stop_strings, logits.shape[1], logits.device)
        st = LoopState(
            logits, lens, params.max_new_tokens, params.temperature, stop_ids, candidates
        )
        start = st.lens.clone()
        while True:
            self.llama._native.loop(run.cache, st)
            waiting = (st.state == st.WAIT).nonzero().flatten().tolist()
            if not waiting:
                break
            for i in waiting:
                done = self._ends_a_stop(st.toks[i], int(st.n_out[i]), params)
                st.state[i] = st.DONE if done else st.FEED
        run.toks[run.rows], run.lps[run.rows], run.n_out[run.rows] = st.toks, st.lps, st.n_out
        fed = (st.lens - start).tolist()
        run.fed_rows = {int(b): f for b, f in zip(run.rows.tolist(), fed, strict=True)}
        self.stats["decode_steps"] += max(fed, default=0)
        self.stats["row_steps"] += sum(fed)
        self._retire(run, list(range(len(run.rows))))

    def _stop_candidates(self, stops: tuple[str, ...], vocab: int, device: Any) -> Any:
        """The ids whose text holds the last character of a stop string: only a row that
        samples one of them can have just completed one, so only those rows decode text."""
        import torch

        if not stops:
            return None
        if stops not in self._candidates:
            texts = self.tok.batch_decode([[i] for i in range(vocab)], skip_special_tokens=False)
            ends = {s[-1] for s in stops}
            mask = [any(c in t for c in ends) for t in texts]
            self._candidates[stops] = torch.tensor(mask, dtype=torch.bool, device=device)
        return self._candidates[stops]

    def _stop_string_rows(
        self, run: _Run, step: int, tok: Any, candidates: Any, finished: Any, params: DecodeParams
    ) -> Any:
        import torch

        hit = torch.zeros_like(finished)
        rows = (candidates[tok] & ~finished).nonzero().flatten().tolist()
        for i in rows:
            hit[i] = self._ends_a_stop(run.toks[int(run.rows[i])], step + 1, params)
        return hit

    def _ends_a_stop(self, sampled: Any, n: int, params: DecodeParams) -> bool:
        """Whether a row's first ``n`` sampled tokens end with one of the stop strings (only
        the last tokens that could hold the longest are decoded)."""
        width = max(len(s.encode()) for s in params.stop_strings)
        text = self.tok.decode(sampled[max(0, n - width) : n].tolist(), skip_special_tokens=False)
        return any(text.endswith(s) for s in params.stop_strings)

    def _retire(self, run: _Run, cache_rows: list[int]) -> None:
        """Store these cache rows: each prompt and the sampled tokens fed back so far (the
        last sampled token's keys were never computed); an entry a row extended whole is
        replaced by it."""
        import numpy as np

        if self.store.budget <= 0:
            return
        for i in cache_rows:
            b = int(run.rows[i])
            a, (key, _) = run.arrays[b], run.found[b]
            entry = self.store.entries.get(key) if key is not None else None
            if entry is not None and run.reuse[b] == len(entry.ids):
                self.store.remove(key)  # its keys and values are all in the new one
            fed = run.fed if run.fed_rows is None else run.fed_rows[b]
            n = len(a) + min(int(run.n_out[b]), fed)
            ids = np.concatenate([a, run.toks[b, : n - len(a)].cpu().numpy()])
            k = run.cache.k[:, i, :, :n].clone()
            v = run.cache.v[:, i, :, :n].clone()
            self.store.add(ids, k, v)


def _groups(new: list[int], start: list[int], overhead: int = 4096) -> list[tuple[int, int]]:
    """Row ranges ``[g0, g1)`` to prefill apart (``new`` sorted longest first): one group, or
    the sorted rows cut into 2, 4 or 8 equal parts, whichever does the least attention work
    (rows x tokens x width), counting ``overhead`` for each further forward."""
    n, best, best_cost = len(new), [(0, len(new))], None
    for parts in (1, 2, 4, 8):
        if parts > n:
            break
        cuts = [round(n * k / parts) for k in range(parts + 1)]
        ranges = [(a, b) for a, b in itertools.pairwise(cuts) if b > a]
        cost = sum(
            (b - a) * new[a] * max(s + new[a] for s in start[a:b]) + overhead for a, b in ranges
        )
        if best_cost is None or cost < best_cost:
            best, best_cost = ranges, cost
    return best


def _sample(logits: Any, params: DecodeParams, exact: bool) -> tuple[Any, Any]:
    """One token per row as ``generate`` draws it (temperature, then top-k, then top-p, then
    one draw from each row's distribution; argmax at 0) and its log-prob at the temperature
    before top-k and top-p (at 0: of the raw logits). ``exact``: the draw is
    ``torch.multinomial``'s own (as ``generate`` draws); else one uniform number a row placed
    on the row's cumulative distribution (:func:`_draw`): the same distribution, several
    times cheaper on a CPU, other random numbers."""
    import torch

    temperature = params.temperature
    if temperature <= 0:
        tok = torch.argmax(logits, dim=-1)
        lp = torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
        return tok, lp
    scores = logits / temperature if temperature != 1.0 else logits
    logp = torch.log_softmax(scores, dim=-1)
    filtered = scores
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k)[0][..., -1:]
        filtered = filtered.masked_fill(scores < kth, -float("inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(filtered, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - params.top_p)
        drop[..., -1:] = False
        filtered = filtered.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    if exact:
        # generate's own probabilities, to the bit: multinomial then draws its very tokens
        tok = torch.multinomial(torch.softmax(filtered, dim=-1), num_samples=1).squeeze(1)
    else:
        tok = _draw(logp.exp() if filtered is scores else torch.softmax(filtered, dim=-1))
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _draw(probs: Any) -> Any:
    """One token a row from ``probs`` ``[B, vocab]`` (rows need not sum to exactly 1): the
    first token whose cumulative probability exceeds a uniform draw over the row's total, so a
    token of probability 0 is never drawn."""
    import torch

    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand_like(total).mul_(total)
    # rounding may carry u up to the total: keep it strictly below, where some token ends
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


__all__ = ["BLOCK", "DecodeParams", "Decoded", "PrefixStore", "StaticDecoder"]
