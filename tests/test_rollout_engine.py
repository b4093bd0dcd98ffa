"""Rollout engines on CPU (``kgsynth train rl --rollout-engine``): the hf engine samples exactly
what the pre-engine ``TokenPolicy.sample`` sampled, keeps the engine contract, is refreshed
after every update, and the log-prob alignment check stops a run whose engine log-probs are not
the training forward's. Without vLLM, ``--rollout-engine vllm`` is one line of error. The vLLM
engine itself is tested on a GPU: tests/test_rollout_engine_vllm.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from kgsynth.agent.engines import Completion, HFEngine, SamplingParams  # noqa: E402
from kgsynth.agent.loop import EpisodeTask  # noqa: E402
from kgsynth.agent.rollout import RolloutConfig, TokenPolicy, run_rollouts  # noqa: E402
from kgsynth.agent.tools import ToolConfig, ToolEnvironment  # noqa: E402
from kgsynth.cli import app  # noqa: E402
from kgsynth.kg.graph import KGGraph  # noqa: E402
from kgsynth.train.grpo_loss import token_logprobs  # noqa: E402
from tests.kgfixtures import movie_kg, movie_ntriples  # noqa: E402

QUESTION = "who directed Kismet?"
QUERY = '<think>x</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>'
RIGHT = '<think>x</think><answer>["William Dieterle"]</answer>'
WRONG = '<think>x</think><answer>["Bette Davis"]</answer>'


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


def reference_sample(policy: TokenPolicy, batch, *, max_new_tokens, temperature, top_p):
    """``TokenPolicy.sample`` as it was before the engine interface (a30c3d0~1), inline: the
    hf engine must reproduce it token for token and log-prob for log-prob."""
    model, tok = policy.model, policy.tok
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(b) for b in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(batch), width), dtype=torch.long)
    for i, b in enumerate(batch):
        ids[i, width - len(b) :] = torch.tensor(b, dtype=torch.long)
        att[i, width - len(b) :] = 1
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, do_sample=True, pad_token_id=pad_id,
        eos_token_id=sorted(policy.eos_ids | policy.stop_ids) or None,
        return_dict_in_generate=True, output_logits=True,
        temperature=temperature, top_p=top_p, top_k=0,
    )  # fmt: skip
    if policy.stop_strings:
        kwargs.update(stop_strings=list(policy.stop_strings), tokenizer=tok)
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, **kwargs)
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    ends = policy.eos_ids | policy.stop_ids
    results = []
    for row in range(len(batch)):
        toks, lps, eos_end = [], [], False
        for j, t in enumerate(new[row].tolist()):
            toks.append(t)
            lps.append(min(0.0, float(logp[row, j])))
            if t in ends:
                eos_end = t in policy.eos_ids
                break
            if policy.stop_strings and policy._ends_with_stop(toks):
                break
        results.append((toks, lps, eos_end))
    return results


@pytest.mark.parametrize("stop_strings", [False, True])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_hf_engine_samples_what_the_pre_engine_code_sampled(tiny, stop_strings, temperature, top_p):
    _, model, tok = tiny
    policy = TokenPolicy(model, tok)
    assert isinstance(policy.engine, HFEngine)
    if stop_strings:  # the path of tokenizers whose closing tags are several tokens
        policy.stop_ids, policy.stop_strings = set(), ["</kg-query>", "</answer>"]
    batch = [policy.prompt_ids([{"role": "user", "content": q}]) for q in ("a", "who is b?")] * 3
    batch[1] = batch[1] + policy.encode("<think>")  # unequal lengths: left padding
    kw = dict(max_new_tokens=48, temperature=temperature, top_p=top_p)
    early = 0
    for seed in range(4):
        torch.manual_seed(seed)
        before = reference_sample(policy, batch, **kw)
        torch.manual_seed(seed)
        now = policy.sample(batch, **kw)
        assert now == before  # ids, log-probs (exact floats) and end flags
        early += sum(len(toks) < 48 for toks, _, _ in now)
    assert early > 0, "no turn stopped early: the stop paths went untested"


def test_hf_engine_rollouts_match_the_pre_engine_rollouts_on_a_seed(tiny):
    _, model, tok = tiny
    graph = KGGraph(movie_kg())
    tasks = [EpisodeTask(q, ["Kismet"]) for q in (QUESTION, "when was Kismet released?")] * 2
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=24, max_obs_tokens=64, temperature=0.8)

    def roll(policy):
        rs = run_rollouts(
            policy, tasks, lambda t: ToolEnvironment(graph, t.question, ToolConfig()), cfg,
            seed=5, batch_size=3,
        )  # fmt: skip
        return [(r.ids, r.mask, r.logprobs, r.turn_of) for r in rs]

    old = TokenPolicy(model, tok)
    old.sample = lambda batch, **kw: reference_sample(old, batch, **kw)
    assert roll(TokenPolicy(model, tok)) == roll(old)


def test_hf_engine_keeps_the_engine_contract(tiny):
    _, model, tok = tiny
    engine = HFEngine(model, tok)
    policy = TokenPolicy(model, tok, engine)
    stop = frozenset(policy.eos_ids | policy.stop_ids)
    prompts = [policy.prompt_ids([{"role": "user", "content": q}]) for q in ("x", "who?", "y")]
    params = SamplingParams(max_new_tokens=20, temperature=0.7, stop_ids=stop)
    torch.manual_seed(0)
    outs = engine.generate(prompts, params)
    assert len(outs) == len(prompts) and all(isinstance(c, Completion) for c in outs)
    for p, c in zip(prompts, outs, strict=True):
        assert 1 <= len(c.ids) == len(c.logprobs) <= 20
        # ends at the first stop id (kept) or at the token budget
        assert not (set(c.ids[:-1]) & stop) and (c.ids[-1] in stop or len(c.ids) == 20)
        # the log-probs are the training forward's at the sampling temperature
        full = torch.tensor([p + c.ids])
        with torch.no_grad():
            lp, _ = token_logprobs(model, full, torch.ones_like(full), 0.7)
        assert c.logprobs == pytest.approx(lp[0, len(p) :].tolist(), abs=1e-4)
        assert all(v <= 0 for v in c.logprobs)
    engine.refresh(model)  # nothing to load: it samples the live module
    with pytest.raises(ValueError, match="policy module"):
        engine.refresh(torch.nn.Linear(1, 1))


class ScriptedEngine:
    """An engine whose turns are fixed texts (a query, then a right answer for even prompts and
    a wrong one for odd), with log-probs from a real forward of the policy module at the
    sampling temperature, plus ``offset``; it records every call with a weights checksum."""

    name = "scripted"

    def __init__(self, model: Any, tok: Any, offset: float = 0.0) -> None:
        self.model, self.tok, self.offset = model, tok, offset
        self.events: list[tuple[str, float]] = []

    def checksum(self) -> float:
        return float(sum(p.detach().double().sum() for p in self.model.parameters()))

    def generate(self, prompts, params: SamplingParams) -> list[Completion]:
        self.events.append(("generate", self.checksum()))
        outs = []
        for k, p in enumerate(prompts):
            # the system prompt names every tag: the observation's triple says a query was run
            seen = self.tok.decode(p)
            text = QUERY if "William Dieterle" not in seen else (RIGHT if k % 2 == 0 else WRONG)
            ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
            full = torch.tensor([list(p) + ids])
            with torch.no_grad():
                lp, _ = token_logprobs(self.model, full, torch.ones_like(full), params.temperature)
            outs.append(Completion(ids, [v + self.offset for v in lp[0, len(p) :].tolist()]))
        return outs

    def refresh(self, model: Any) -> None:
        assert model is self.model
        self.events.append(("refresh", self.checksum()))


@pytest.fixture
def rl_inputs(tmp_path):
    import polars as pl

    from kgsynth.kg.importer import import_kg

    (tmp_path / "kg.nt").write_text(movie_ntriples())
    import_kg(tmp_path / "kg.nt", tmp_path / "kg", force=True)
    pl.DataFrame(
        [{"question": QUESTION, "topic_names": ["Kismet"], "answer_names": ["William Dieterle"]}]
    ).write_parquet(tmp_path / "q.parquet")
    return tmp_path


def _rl(tiny, root: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, [
        "train", "rl", "--questions", str(root / "q.parquet"), "--kg", str(root / "kg"),
        "--init", str(tiny[0]), "--out", str(out), "--recipe", "tiny", "--max-turns", "2",
        "--group-size", "4", "--questions-per-step", "1", "--lr", "1e-2", "--kl-coef", "0",
        "--temperature", "0.7", "--save-steps", "100", *extra,
    ])  # fmt: skip


def _use_engine(monkeypatch, offset: float = 0.0) -> list[ScriptedEngine]:
    import kgsynth.agent.engines as engines

    built: list[ScriptedEngine] = []

    def make(name, *, model, tokenizer, **options):
        assert name == "auto"  # the default
        built.append(ScriptedEngine(model, tokenizer, offset))
        return built[-1]

    monkeypatch.setattr(engines, "make_engine", make)
    return built


def test_engine_is_refreshed_after_each_update_before_the_next_rollouts(
    tiny, rl_inputs, monkeypatch
):
    built = _use_engine(monkeypatch)
    out = rl_inputs / "rl"
    res = _rl(tiny, rl_inputs, out, "--max-steps", "3")
    assert res.exit_code == 0, res.output
    (engine,) = built
    kinds = [k for k, _ in engine.events]
    # each step: a query turn and an answer turn sampled, then the refresh
    assert kinds == ["generate", "generate", "refresh"] * 3
    sums = [s for _, s in engine.events]
    for step in range(3):
        rolled, refreshed = sums[3 * step], sums[3 * step + 2]
        assert sums[3 * step + 1] == rolled  # no update inside a step's rollouts
        assert refreshed != rolled  # the refresh came after the optimizer update
        if step < 2:  # and the next step's rollouts sample those very weights
            assert sums[3 * step + 3] == refreshed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["trained_tokens"] > 0 for r in rows)  # right and wrong answers: groups kept
    # the alignment check ran on every step and found the log-probs the training forward's
    assert all(r["logprob_mismatch_mean"] < 1e-4 for r in rows)


def test_alignment_check_stops_a_run_whose_engine_log_probs_are_off(tiny, rl_inputs, monkeypatch):
    _use_engine(monkeypatch, offset=-0.3)
    out = rl_inputs / "rl"
    res = _rl(tiny, rl_inputs, out, "--max-steps", "2")
    assert res.exit_code == 1
    assert "error:" in res.output and "--logprob-tolerance 0.05" in res.output
    # the step's mean gap is the engine's offset
    assert "step 1:" in res.output and "by 0.3 per sampled token" in res.output
    assert not (out / "model.safetensors").exists()
    # a tolerance above the gap lets the same run finish
    _use_engine(monkeypatch, offset=-0.3)
    res = _rl(tiny, rl_inputs, rl_inputs / "rl2", "--max-steps", "2", "--logprob-tolerance", "0.5")
    assert res.exit_code == 0, res.output


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_without_vllm_is_one_line_of_error(tiny, rl_inputs):
    res = _rl(tiny, rl_inputs, rl_inputs / "rl", "--rollout-engine", "vllm", "--dry-run")
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert "pip install kgsynth[vllm]" in lines[0] and "CUDA GPU" in lines[0]
    assert not (rl_inputs / "rl").exists()


def test_engine_options_are_checked():
    from kgsynth.core.errors import ConfigError
    from kgsynth.train.grpo_config import GRPOConfig, logprob_tolerance

    for bad, match in (
        ({"rollout_engine": "sglang"}, "rollout_engine"),
        ({"rollout_engine": "vllm", "top_p": 0.9}, "top_p 1"),
        ({"rollout_engine": "vllm", "lora_r": 8}, "lora_r"),
        ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization"),
        ({"logprob_tolerance": 0.0}, "logprob_tolerance"),
    ):
        with pytest.raises(ConfigError, match=match):
            GRPOConfig(**bad)
    assert logprob_tolerance(GRPOConfig()) == 0.05
    assert logprob_tolerance(GRPOConfig(rollout_engine="vllm")) == 0.2
    assert logprob_tolerance(GRPOConfig(logprob_tolerance=0.01)) == 0.01
