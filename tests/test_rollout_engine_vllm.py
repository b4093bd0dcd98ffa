"""The vllm rollout engine on a real vLLM (``-m gpu``; deselected by default, skipped without a
CUDA GPU or without vLLM: ``pip install kgsynth[vllm]``). A tiny model built in the test
(head size 64, which every vLLM attention backend takes), its tokenizer trained here; no hub
downloads. Run: ``pytest -m gpu tests/test_rollout_engine_vllm.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# bf16 in the engine against the fp32 training forward: the vllm engine's default tolerance
TOLERANCE = 0.2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from kgsynth.agent.loop import system_prompt
    from kgsynth.train.tiny import build_tiny_model

    texts = [
        system_prompt("graphwalker", 2),
        '<think>x</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>',
        "<information>(Kismet, directed_by, William Dieterle)</information>",
        '<answer>["William Dieterle"]</answer> who directed Kismet Juarez Jezebel Bette Davis',
    ] * 4
    root = tmp_path_factory.mktemp("tiny_vllm")
    return build_tiny_model(texts, root, vocab_size=600, hidden_size=128, num_heads=2, seed=0)


@pytest.fixture(scope="module")
def hf(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).cuda().eval()
    return model, AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def engine(tiny, hf):
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install kgsynth[vllm]")
    from kgsynth.agent.engines import make_engine

    model, tok = hf
    return make_engine(
        "vllm", model=model, tokenizer=tok, model_dir=str(tiny),
        gpu_memory_utilization=0.3, dtype="bfloat16", seed=0,
    )  # fmt: skip


def _prompts(model, tok):
    from kgsynth.agent.rollout import TokenPolicy

    policy = TokenPolicy(model, tok)  # its chat template and stop ids
    qs = ("who directed Kismet?", "when was Juarez released?", "x", "who is Bette Davis?")
    return [policy.prompt_ids([{"role": "user", "content": q}]) for q in qs] * 2, policy


def _gap(model, prompts, outs, temperature: float) -> float:
    """Mean |engine log-prob - the model's forward log-prob| over the sampled tokens."""
    from kgsynth.train.grpo_loss import token_logprobs

    gaps = []
    for p, c in zip(prompts, outs, strict=True):
        full = torch.tensor([list(p) + c.ids], device="cuda")
        with torch.no_grad():
            lp, _ = token_logprobs(model, full, torch.ones_like(full), temperature)
        gaps += [abs(a - b) for a, b in zip(c.logprobs, lp[0, len(p) :].tolist(), strict=True)]
    return sum(gaps) / len(gaps)


def test_vllm_engine_token_in_token_out_with_the_forward_log_probs(engine, hf):
    from kgsynth.agent.engines import SamplingParams

    model, tok = hf
    prompts, policy = _prompts(model, tok)
    stop = frozenset(policy.eos_ids | policy.stop_ids)
    params = SamplingParams(max_new_tokens=32, temperature=0.7, stop_ids=stop)
    torch.manual_seed(0)
    outs = engine.generate(prompts, params)
    torch.manual_seed(0)
    again = engine.generate(prompts, params)
    assert [c.ids for c in outs] == [c.ids for c in again]  # seeded from the torch RNG
    assert len(outs) == len(prompts)
    for c in outs:
        assert 1 <= len(c.ids) == len(c.logprobs) <= 32 and all(v <= 0 for v in c.logprobs)
        assert not (set(c.ids[:-1]) & stop) and (c.ids[-1] in stop or len(c.ids) == 32)
    assert _gap(model, prompts, outs, 0.7) < TOLERANCE


def test_refresh_loads_the_policy_weights_in_place(engine, hf):
    import copy

    from kgsynth.agent.engines import SamplingParams

    model, tok = hf
    prompts, _ = _prompts(model, tok)
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    changed = copy.deepcopy(model)
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, device="cuda"))
    engine.refresh(changed)
    outs = engine.generate(prompts, params)
    near, far = _gap(changed, prompts, outs, 1.0), _gap(model, prompts, outs, 1.0)
    assert near < TOLERANCE and far > 3 * near, (near, far)
    engine.refresh(model)  # back, for the other tests
    outs = engine.generate(prompts, params)
    assert _gap(model, prompts, outs, 1.0) < TOLERANCE


def test_train_rl_with_the_vllm_engine(tiny, tmp_path):
    """Two GRPO steps with ``--rollout-engine vllm`` in a process of their own (one vLLM engine
    per process): the alignment check passes and tokens/s is logged."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install kgsynth[vllm]")
    import polars as pl

    from kgsynth.kg.importer import import_kg
    from tests.kgfixtures import movie_ntriples

    (tmp_path / "kg.nt").write_text(movie_ntriples())
    import_kg(tmp_path / "kg.nt", tmp_path / "kg", force=True)
    pl.DataFrame(
        [{"question": "who directed Kismet?", "topic_names": ["Kismet"],
          "answer_names": ["William Dieterle"]}]
    ).write_parquet(tmp_path / "q.parquet")  # fmt: skip
    out = tmp_path / "rl"
    cmd = [
        sys.executable, "-c", "from kgsynth.cli import app; app()", "train", "rl",
        "--questions", str(tmp_path / "q.parquet"), "--kg", str(tmp_path / "kg"),
        "--init", str(tiny), "--out", str(out), "--recipe", "tiny", "--max-turns", "2",
        "--group-size", "4", "--questions-per-step", "2", "--max-steps", "2",
        "--rollout-engine", "vllm", "--vllm-gpu-memory-utilization", "0.3",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["generated_tokens"] > 0 and r["rollout_tokens_per_s"] > 0
        assert r["logprob_mismatch_mean"] < TOLERANCE
