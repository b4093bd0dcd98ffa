"""The static rollout engine (``--rollout-engine static``, issue 46): on the tiny Llama policy it
samples what the hf engine samples (the same tokens at temperature 0 and, from the same seed,
when sampling), its log-probs are a full forward's, an episode's later turns start from the
keys and values its earlier turns left (and give the same rollouts as the hf engine), a weight
update is never served stale keys, other architectures are refused in one line, and GRPO runs
with it under the alignment check."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from kgsynth.agent.engines import (  # noqa: E402
    EngineUnavailable,
    HFEngine,
    SamplingParams,
    make_engine,
)
from kgsynth.agent.loop import EpisodeTask  # noqa: E402
from kgsynth.agent.rollout import RolloutConfig, TokenPolicy, run_rollouts  # noqa: E402
from kgsynth.agent.static_engine import StaticEngine  # noqa: E402
from kgsynth.agent.tools import ToolConfig, ToolEnvironment  # noqa: E402
from kgsynth.kg.graph import KGGraph  # noqa: E402
from kgsynth.llm.static_decode import BLOCK, PrefixStore  # noqa: E402
from kgsynth.train.grpo_loss import token_logprobs  # noqa: E402
from tests.kgfixtures import movie_kg  # noqa: E402

STOPS = ("</kg-query>", "</answer>")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.kgfixtures import tiny_agent_model

    path = tiny_agent_model(tmp_path_factory.mktemp("tiny"), vocab_size=600)
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def prompts(policy: TokenPolicy) -> list[list[int]]:
    """Chat prompts of different lengths (one 3 tokens longer than its twin)."""
    qs = ("a", "who is b?", "who directed Kismet Juarez Jezebel Bette Davis?")
    batch = [policy.prompt_ids([{"role": "user", "content": q}]) for q in qs] * 2
    batch[1] = batch[1] + policy.encode("<think>x y")
    return batch


def params(policy: TokenPolicy, temperature: float, top_p: float = 1.0, strings: bool = False):
    stop = frozenset(policy.eos_ids | policy.stop_ids)
    return SamplingParams(
        max_new_tokens=40,
        temperature=temperature,
        top_p=top_p,
        stop_ids=frozenset(policy.eos_ids) if strings else stop,
        stop_strings=STOPS if strings else (),
    )


@pytest.mark.parametrize("strings", [False, True])
@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_static_engine_samples_what_the_hf_engine_samples(tiny, temperature, top_p, strings):
    _, model, tok = tiny
    static = StaticEngine(model, tok, exact_rng=True)
    policies = {"hf": TokenPolicy(model, tok), "static": TokenPolicy(model, tok, static)}
    batch = prompts(policies["hf"])
    kw = dict(max_new_tokens=40, temperature=temperature, top_p=top_p)
    # the random policy's greedy turns close no tag: at 0 they also stop at a token it says
    said = {policies["hf"].sample(batch, **kw)[0][0][4]} if temperature == 0 else set()
    for policy in policies.values():
        if strings:  # the path of tokenizers whose closing tags are several tokens
            policy.stop_ids, policy.stop_strings = set(), list(STOPS)
        policy.stop_ids = policy.stop_ids | said
    lengths = set()
    for seed in range(3):
        torch.manual_seed(seed)
        want = policies["hf"].sample(batch, **kw)
        torch.manual_seed(seed)
        got = policies["static"].sample(batch, **kw)
        for (w_ids, w_lps, w_end), (g_ids, g_lps, g_end) in zip(want, got, strict=True):
            assert (g_ids, g_end) == (w_ids, w_end)
            assert g_lps == pytest.approx(w_lps, abs=1e-4)
            lengths.add(len(g_ids))
    assert min(lengths) < 40, "no turn stopped early: the stop paths went untested"
    # the later seeds' prompts began with sequences the first left: keys and values reused
    assert static.decoder.stats["reused_tokens"] > 0


def test_a_grouped_query_policy_samples_what_the_hf_engine_samples(tmp_path):
    """tiny_kv_heads: one key-value head for the four query heads (a KV cache a quarter the
    size): the same tokens and log-probs as generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.kgfixtures import tiny_agent_model

    path = tiny_agent_model(tmp_path / "gqa", vocab_size=600, kv_heads=1)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert model.config.num_key_value_heads == 1 and model.config.num_attention_heads == 4
    static = StaticEngine(model, tok, exact_rng=True)
    assert static.decoder.llama.new_cache(2, 8).k.shape[2] == 1
    policies = {"hf": TokenPolicy(model, tok), "static": TokenPolicy(model, tok, static)}
    batch = prompts(policies["hf"])
    for seed in range(2):
        torch.manual_seed(seed)
        want = policies["hf"].sample(batch, max_new_tokens=40, temperature=1.0, top_p=1.0)
        torch.manual_seed(seed)
        got = policies["static"].sample(batch, max_new_tokens=40, temperature=1.0, top_p=1.0)
        for (w_ids, w_lps, w_end), (g_ids, g_lps, g_end) in zip(want, got, strict=True):
            assert (g_ids, g_end) == (w_ids, w_end)
            assert g_lps == pytest.approx(w_lps, abs=1e-4)


def test_sampled_log_probs_are_a_full_forwards(tiny):
    _, model, tok = tiny
    policy = TokenPolicy(model, tok)
    engine = StaticEngine(model, tok)
    batch = prompts(policy)
    torch.manual_seed(1)
    outs = engine.generate(batch, params(policy, 0.7))
    stop = policy.eos_ids | policy.stop_ids
    for p, c in zip(batch, outs, strict=True):
        assert 1 <= len(c.ids) == len(c.logprobs) <= 40
        assert not (set(c.ids[:-1]) & stop) and (c.ids[-1] in stop or len(c.ids) == 40)
        full = torch.tensor([p + c.ids])
        with torch.no_grad():
            lp, _ = token_logprobs(model, full, torch.ones_like(full), 0.7)
        assert c.logprobs == pytest.approx(lp[0, len(p) :].tolist(), abs=1e-4)
        assert all(v <= 0 for v in c.logprobs)


def test_multi_turn_rollouts_reuse_the_cache_and_match_the_hf_engine(tiny):
    _, model, tok = tiny
    graph = KGGraph(movie_kg())
    questions = ("who directed Kismet?", "when was Kismet released?", "who starred in Jezebel?")
    tasks = [EpisodeTask(q, ["Kismet"]) for q in questions] * 3
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=24, max_obs_tokens=64, temperature=0.8)

    def roll(engine):
        rs = run_rollouts(
            TokenPolicy(model, tok, engine), tasks,
            lambda t: ToolEnvironment(graph, t.question, ToolConfig()), cfg, seed=5, batch_size=4,
        )  # fmt: skip
        return rs

    static = StaticEngine(model, tok, exact_rng=True)
    want, got = roll(HFEngine(model, tok)), roll(static)
    assert max(len(r.episode.turns) for r in got) >= 2, "no episode took a second turn"
    for w, g in zip(want, got, strict=True):
        assert (g.ids, g.mask, g.turn_of) == (w.ids, w.mask, w.turn_of)
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    stats = static.decoder.stats
    prefilled = stats["prompt_tokens"] - stats["reused_tokens"]
    # the first call prefilled its 4 prompts; every other first turn only what follows the
    # shared system prompt (its question, a block at most before); a later turn only the
    # environment's tokens and the last sampled token
    env = sum(r.mask[r.prompt_len :].count(0) for r in got)
    turns = sum(len(r.episode.turns) for r in got)
    first = 4 * max(r.prompt_len for r in got) + len(tasks) * (BLOCK + 16)
    assert prefilled <= first + env + turns < stats["prompt_tokens"] / 2


def test_fast_engine_rollouts_are_greedy_equal_and_their_log_probs_a_full_forwards(tiny):
    """The default engine (its own draw, rows reordered by length, finished rows dropped
    mid-turn): at temperature 0 the hf engine's rollouts; sampled, every log-prob is a full
    forward's over the whole episode."""
    _, model, tok = tiny
    graph = KGGraph(movie_kg())
    tasks = [EpisodeTask(q, ["Kismet"]) for q in ("who directed Kismet?", "Kismet year?")] * 5

    def roll(engine, temperature):
        cfg = RolloutConfig(
            max_turns=3, max_turn_tokens=24, max_obs_tokens=64, temperature=temperature
        )
        return run_rollouts(
            TokenPolicy(model, tok, engine), tasks,
            lambda t: ToolEnvironment(graph, t.question, ToolConfig()), cfg, seed=3, batch_size=10,
        )  # fmt: skip

    static = StaticEngine(model, tok)
    for want, got in zip(roll(HFEngine(model, tok), 0.0), roll(static, 0.0), strict=True):
        assert (got.ids, got.mask) == (want.ids, want.mask)
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    rollouts = roll(static, 1.0)
    for r in rollouts:
        full = torch.tensor([r.ids])
        with torch.no_grad():
            lp, _ = token_logprobs(model, full, torch.ones_like(full), 1.0)
        sampled = [i for i, m in enumerate(r.mask) if m]
        assert [r.logprobs[i] for i in sampled] == pytest.approx(
            [float(lp[0, i]) for i in sampled], abs=1e-4
        )


def test_finished_rows_leave_the_batch_and_their_keys_are_kept(tiny):
    _, model, tok = tiny
    policy = TokenPolicy(model, tok)
    batch = prompts(policy) * 2  # 12 rows
    hf, static = HFEngine(model, tok), StaticEngine(model, tok)
    sp = params(policy, 0.0)
    said = hf.generate(batch, sp)
    # rows 0 and 2 (and their copies, 8 of 12 rows) stop at their third token
    sp = SamplingParams(
        **{**sp.__dict__, "stop_ids": sp.stop_ids | {said[0].ids[2], said[2].ids[2]}}
    )
    want, got = hf.generate(batch, sp), static.generate(batch, sp)
    assert [len(c.ids) for c in got].count(40) <= 4
    for w, g in zip(want, got, strict=True):
        assert g.ids == w.ids and g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    stats = static.decoder.stats
    assert stats["row_steps"] < 12 * stats["decode_steps"]  # the batch shrank
    # every row's keys were kept: the same prompts extended now prefill only the new tokens
    info = policy.encode("<information>x</information>")
    again = [p + c.ids + info for p, c in zip(batch, got, strict=True)]
    before = stats["reused_tokens"]
    static.generate(again, sp)
    assert stats["reused_tokens"] - before >= sum(
        len(p) + len(c.ids) - 1 for p, c in zip(batch, got, strict=True)
    )


def test_a_weight_update_is_never_served_stale_keys(tiny):
    from transformers import AutoModelForCausalLM

    path, _, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    policy = TokenPolicy(model, tok)
    batch = prompts(policy)
    static, hf = StaticEngine(model, tok), HFEngine(model, tok)
    sp = params(policy, 0.0)
    static.generate(batch, sp)  # fills the prefix cache
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    full = torch.tensor([batch[2]])
    lp, _ = token_logprobs(model, full, torch.ones_like(full), 1.0)
    (-lp.sum()).backward()
    opt.step()  # in place, as the GRPO update; no refresh called
    want, got = hf.generate(batch, sp), static.generate(batch, sp)
    assert [c.ids for c in got] == [c.ids for c in want]
    for w, g in zip(want, got, strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    static.refresh(model)
    assert not static.decoder.store.entries
    with pytest.raises(ValueError, match="policy module"):
        static.refresh(torch.nn.Linear(1, 1))


def test_other_architectures_are_refused_in_one_line(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, _, tok = tiny
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tok)))
    with pytest.raises(EngineUnavailable) as exc:
        make_engine("static", model=gpt2, tokenizer=tok)
    text = str(exc.value)
    assert "\n" not in text and "'gpt2'" in text and "hf engine" in text
    # the default engine: static for the Llama policy on a CPU, hf for what static cannot run
    _, model, _ = tiny
    assert make_engine("auto", model=model, tokenizer=tok).name == "static"
    assert make_engine("auto", model=gpt2, tokenizer=tok).name == "hf"


def test_prefix_store_finds_the_longest_prefix_and_keeps_its_budget():
    import numpy as np

    def kv(n):
        return torch.zeros((1, 1, n, 2)), torch.zeros((1, 1, n, 2))

    one_entry = kv(3 * BLOCK)[0].nelement() * 4 * 2
    store = PrefixStore(budget_bytes=2 * one_entry)
    a = np.arange(3 * BLOCK, dtype=np.int64)
    b = a.copy()
    b[2 * BLOCK + 5] = -1  # shares two blocks and five tokens with a
    store.add(a, *kv(len(a)))
    key, n = store.lookup(np.concatenate([b, [7, 8]]))
    assert key is not None and n == 2 * BLOCK + 5
    assert store.lookup(np.arange(BLOCK - 1, dtype=np.int64)) == (None, 0)  # no whole block
    assert store.lookup(a[::-1].copy()) == (None, 0)
    store.add(b, *kv(len(b)))
    store.lookup(a)  # a is now the most recently used
    store.add(a + 1000, *kv(len(a)))  # over budget: b, the least recently used, goes
    assert len(store.entries) == 2 and store.used <= store.budget
    assert store.lookup(b)[1] == 2 * BLOCK + 5  # found in a only


def test_grpo_runs_with_the_static_engine_under_the_alignment_check(tiny, tmp_path):
    import polars as pl
    from typer.testing import CliRunner

    from kgsynth.cli import app
    from kgsynth.kg.importer import import_kg
    from tests.kgfixtures import movie_ntriples

    (tmp_path / "kg.nt").write_text(movie_ntriples())
    import_kg(tmp_path / "kg.nt", tmp_path / "kg", force=True)
    pl.DataFrame(
        [{"question": "who directed Kismet?", "topic_names": ["Kismet"],
          "answer_names": ["William Dieterle"]}]
    ).write_parquet(tmp_path / "q.parquet")  # fmt: skip
    out = tmp_path / "rl"
    res = CliRunner().invoke(app, [
        "train", "rl", "--questions", str(tmp_path / "q.parquet"), "--kg", str(tmp_path / "kg"),
        "--init", str(tiny[0]), "--out", str(out), "--recipe", "tiny", "--max-turns", "2",
        "--group-size", "4", "--questions-per-step", "1", "--lr", "1e-2", "--kl-coef", "0",
        "--temperature", "0.7", "--save-steps", "100", "--max-steps", "2",
        "--rollout-engine", "static",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["generated_tokens"] > 0 for r in rows)
    # the rollout log-probs are the training forward's, the second step's after an update
    assert all(r["logprob_mismatch_mean"] < 1e-4 for r in rows)


@pytest.mark.parametrize("exact", [False, True])
def test_the_draw_follows_the_distribution_and_its_nucleus(exact):
    from kgsynth.llm.static_decode import DecodeParams, _sample

    def draw(logits, temperature, top_p, exact, top_k=0):
        params = DecodeParams(1, temperature, top_p=top_p, top_k=top_k)
        return _sample(logits, params, exact)

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(20_000, 1) * 0.7  # at temperature 0.7: these probabilities
    torch.manual_seed(0)
    tok, lp = draw(logits, 0.7, 1.0, exact)
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert freq.tolist() == pytest.approx(probs.tolist(), abs=0.012)
    assert lp.tolist() == pytest.approx(probs.log()[tok].tolist(), abs=1e-5)
    # top-p 0.7: the nucleus is the two likeliest tokens; the log-prob stays before top-p
    tok, lp = draw(logits, 0.7, 0.7, exact)
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert freq[2:].sum() == 0 and float(freq[0]) == pytest.approx(0.5 / 0.8, abs=0.012)
    assert lp.tolist() == pytest.approx(probs.log()[tok].tolist(), abs=1e-5)
    # top-k 3 then top-p 0.9: of 0.5, 0.3, 0.15 the nucleus is all three (0.8 < 0.9)
    tok, _ = draw(logits, 0.7, 0.9, exact, top_k=3)
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert float(freq[3]) == 0 and float(freq[2]) == pytest.approx(0.15 / 0.95, abs=0.012)
    greedy, _ = draw(logits[:3], 0.0, 1.0, exact)
    assert greedy.tolist() == [0, 0, 0]


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (0.8, 7)])
def test_the_hf_backend_answers_through_the_static_engine_as_generate_does(tiny, temperature, seed):
    """Eval, free rollouts and the early stopping ask the hf backend: on a CPU it decodes a
    Llama with the static engine (engine auto) and gives generate's completions (same text,
    token counts, finish reasons), top-k 50 and stop strings included; a later turn's prompt
    starts from the keys its first turn left."""
    from kgsynth.llm.base import GenerationParams, Request
    from kgsynth.llm.hf_backend import HFLLM

    path = str(tiny[0])
    params = GenerationParams(temperature=temperature, max_tokens=30, stop=STOPS, seed=seed)
    system = {"role": "system", "content": "answer with <answer>[...]</answer>"}
    questions = ("who directed Kismet?", "a", "when was Juarez released?", "who is b?")
    reqs = [Request.make([system, {"role": "user", "content": q}], params) for q in questions * 2]
    auto, hf = HFLLM(path, device="cpu", batch_size=4), HFLLM(path, engine="hf", batch_size=4)
    want, got = hf.generate_batch(reqs), auto.generate_batch(reqs)
    assert auto._decoder and hf._decoder is None  # the static engine answered
    # from the weights alone (light_llama.py), not transformers' LlamaForCausalLM
    assert not hasattr(auto._model, "generate") and hasattr(hf._model, "generate")
    for w, g in zip(want, got, strict=True):
        assert (g.text, g.finish_reason, g.prompt_tokens, g.completion_tokens) == (
            w.text, w.finish_reason, w.prompt_tokens, w.completion_tokens
        )  # fmt: skip
    # the next turn: the conversation so far and an observation
    later = [
        Request.make([*r.message_dicts(), {"role": "assistant", "content": c.text},
                      {"role": "user", "content": "<information>x</information>"}], params)
        for r, c in zip(reqs, got, strict=True)
    ]  # fmt: skip
    before = auto._decoder.stats["reused_tokens"]
    assert [c.text for c in auto.generate_batch(later)] == [
        c.text for c in hf.generate_batch(later)
    ]
    assert auto._decoder.stats["reused_tokens"] - before > sum(c.prompt_tokens for c in got) / 2
    with pytest.raises(Exception, match="engine must be one of"):
        HFLLM(path, engine="fast")
