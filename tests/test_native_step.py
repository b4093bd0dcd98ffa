"""The native decode step (kgsynth/llm/decode_step.c through kgsynth/llm/native_step.py): the
same logits and keys as the torch forward it replaces, on both of its instruction paths, and
the torch forward wherever it cannot run."""

from __future__ import annotations

import shutil

import pytest
import torch

from kgsynth.llm import native_step
from kgsynth.llm.kv_llama import KVLlama

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)


def _model(tmp_path, *, heads=4, kv_heads=4, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=176,  # not a multiple of 64: the products' edge columns
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the initialisation's: logits that differ
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    return model


def _forwards(llama: KVLlama, native: bool, seed: int = 1):
    """A prefill of ragged rows, a second prefill on top and three decode steps; the logits
    of each and the keys and values of the filled slots."""
    gen = torch.Generator().manual_seed(seed)
    B, cap = 7, 160
    llama.use_native = native
    llama.bind(cap)
    assert (llama._native is not None) == native
    cache = llama.new_cache(B, cap)
    start = torch.zeros(B, dtype=torch.long)
    valid = torch.randint(1, 50, (B,), generator=gen)
    outs = [llama.forward(cache, torch.randint(0, 300, (B, 50), generator=gen), start, valid)]
    start = start + valid
    valid = torch.randint(1, 30, (B,), generator=gen)
    outs.append(llama.forward(cache, torch.randint(0, 300, (B, 30), generator=gen), start, valid))
    start = start + valid
    for _ in range(3):
        ids = torch.randint(0, 300, (B, 1), generator=gen)
        outs.append(llama.forward(cache, ids, start, torch.ones_like(start)))
        start = start + 1
    filled = [(cache.k[:, b, :, :n].clone(), cache.v[:, b, :, :n].clone()) for b, n in
              enumerate(start.tolist())]  # fmt: skip
    return outs, filled


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """Builds into an empty cache folder, with the instruction set asked for."""

    def build(arch: str | None):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        if arch:
            monkeypatch.setenv(native_step.ARCH_ENV, arch)
        else:
            monkeypatch.delenv(native_step.ARCH_ENV, raising=False)
        native_step.load.cache_clear()
        lib = native_step.load()
        assert lib is not None
        assert list((tmp_path / "cache" / "kgsynth" / "native").glob("decode_step-*.so"))
        return lib

    yield build
    native_step.load.cache_clear()


@pytest.mark.parametrize("arch", [None, "x86-64"], ids=["this-cpu", "portable"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 1), (2, 2)], ids=["mha", "gqa", "d32"])
def test_native_logits_and_keys_are_the_torch_forwards(tmp_path, fresh_build, arch, heads,
                                                       kv_heads):  # fmt: skip
    if arch == "x86-64" and native_step.platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    fresh_build(arch)
    with torch.inference_mode():
        llama = KVLlama(_model(tmp_path, heads=heads, kv_heads=kv_heads))
        want, want_kv = _forwards(llama, native=False)
        got, got_kv = _forwards(llama, native=True)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=5e-5, rtol=1e-5), (a - b).abs().max()
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    for (ka, va), (kb, vb) in zip(got_kv, want_kv, strict=True):
        assert torch.allclose(ka, kb, atol=1e-5) and torch.allclose(va, vb, atol=1e-5)


def test_a_wrong_token_id_is_torchs_error_not_a_read_out_of_bounds(tmp_path):
    native_step.load.cache_clear()
    with torch.inference_mode():
        llama = KVLlama(_model(tmp_path))
        llama.bind(32)
        assert llama._native is not None
        cache = llama.new_cache(2, 32)
        start, one = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long)
        with pytest.raises(IndexError):
            llama.forward(cache, torch.tensor([[3], [300]]), start, one)
        # a position past the cache: refused natively, torch's indexing error
        with pytest.raises((IndexError, RuntimeError)):
            llama.forward(cache, torch.tensor([[3], [4]]), start + 32, one)


def test_switched_off_the_decoder_runs_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("KGSYNTH_NATIVE", "0")
    native_step.load.cache_clear()
    try:
        assert native_step.load() is None
        llama = KVLlama(_model(tmp_path))
        llama.bind(16)
        assert llama._native is None and not llama.native()
    finally:
        native_step.load.cache_clear()


def _loop_rows(tmp_path, B, logits, room, temperature, stop=(), cand=()):
    from kgsynth.llm.native_step import LoopState

    llama = KVLlama(_model(tmp_path))
    llama.bind(room + 1)
    assert llama._native is not None
    cache = llama.new_cache(B, room + 1)
    st = LoopState(
        logits.expand(B, -1),
        torch.zeros(B, dtype=torch.long),
        room,
        temperature,
        torch.tensor(sorted(stop), dtype=torch.long),
        None if not cand else torch.isin(torch.arange(300), torch.tensor(sorted(cand))),
    )
    return llama, cache, st


@pytest.mark.parametrize("arch", [None, "x86-64"], ids=["this-cpu", "portable"])
def test_the_native_draw_follows_the_distribution_and_reports_its_log_prob(
    tmp_path, fresh_build, arch
):
    if arch == "x86-64" and native_step.platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    fresh_build(arch)
    torch.manual_seed(0)
    logits = torch.randn(1, 300) * 3
    logits[0, :10] = -float("inf")  # masked tokens: never drawn
    with torch.inference_mode():
        llama, cache, st = _loop_rows(tmp_path, 20000, logits, 1, 0.7)
        llama._native.loop(cache, st)
    assert bool((st.state == st.DONE).all()) and bool((st.n_out == 1).all())
    logp = torch.log_softmax(logits[0] / 0.7, dim=-1)
    tok = st.toks[:, 0]
    assert torch.allclose(st.lps[:, 0], logp[tok], atol=1e-5)
    freq = torch.bincount(tok, minlength=300).double() / len(tok)
    p = logp.exp().double()
    # each token's frequency within 5 standard errors of its probability
    assert bool(((freq - p).abs() <= 5 * (p * (1 - p) / len(tok)).sqrt() + 1e-4).all())
    assert freq[:10].sum() == 0
    with torch.inference_mode():  # greedy: the argmax, with log_softmax's log-prob
        llama, cache, st = _loop_rows(tmp_path, 3, logits, 1, 0.0)
        llama._native.loop(cache, st)
    best = int(logits.argmax())
    assert st.toks[:, 0].tolist() == [best] * 3
    assert torch.allclose(st.lps[:, 0], torch.log_softmax(logits[0], -1)[best], atol=1e-5)


def test_the_native_loop_stops_at_stop_ids_and_waits_on_candidates(tmp_path):
    """A row ends at a stop id or after ``room`` tokens; a token that may end a stop string
    hands the row back (WAIT) until the caller says DONE or FEED."""
    native_step.load.cache_clear()
    logits = torch.zeros(1, 300)
    logits[0, 7] = 50.0  # greedy first token: 7
    with torch.inference_mode():
        llama, cache, st = _loop_rows(tmp_path, 2, logits, 12, 0.0, stop=(7,))
        llama._native.loop(cache, st)
        assert st.state.tolist() == [st.DONE] * 2 and st.n_out.tolist() == [1, 1]
        llama, cache, st = _loop_rows(tmp_path, 2, logits, 12, 0.0, cand=(7,))
        llama._native.loop(cache, st)
        assert st.state.tolist() == [st.WAIT] * 2 and st.lens.tolist() == [0, 0]
        st.state[0], st.state[1] = st.DONE, st.FEED
        llama._native.loop(cache, st)
        assert st.n_out[0] == 1 and st.state[0] == st.DONE
        # row 1 went on: 7 fed at slot 0, then greedy tokens until a candidate or 12 tokens
        assert st.lens[1] >= 1 and st.n_out[1] >= 2
        assert st.state[1] in (st.WAIT, st.DONE)
        # a row that would run past its cache is refused, not written
        st2 = _loop_rows(tmp_path, 1, logits, 12, 0.0)[2]
        st2.lens[0] = 5
        with pytest.raises(ValueError, match="past their cache"):
            llama._native.loop(llama.new_cache(1, 13), st2)


def test_loading_it_leaves_the_process_floating_point_alone(fresh_build):
    """-ffast-math is given to the compile only: the link adds no start-up code that would
    flush the whole process's subnormal floats to zero."""
    fresh_build(None)
    tiny = torch.tensor([1e-39], dtype=torch.float32)
    assert float(tiny * 1.0) > 0 and float(tiny / 2) > 0
