"""The static engine's Llama from the safetensors alone: the logits of transformers' class, bit
for bit, and the real class wherever the light loader cannot hold a checkpoint exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kgsynth.llm.kv_llama import KVLlama  # noqa: E402
from kgsynth.llm.light_llama import load_light_llama, refusal  # noqa: E402
from tests.kgfixtures import tiny_agent_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_agent_model(tmp_path_factory.mktemp("light"), vocab_size=500)


def _logits(model, ids, valid):
    llama = KVLlama(model)
    llama.bind(32)
    cache = llama.new_cache(ids.shape[0], 32)
    with torch.no_grad():
        return llama.forward(cache, ids, torch.zeros(ids.shape[0], dtype=torch.long), valid)


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_the_light_weights_give_the_real_models_logits(tiny, tmp_path, kv_heads):
    from transformers import AutoModelForCausalLM

    path = tiny if kv_heads is None else tiny_agent_model(tmp_path, 500, kv_heads=kv_heads)
    assert refusal(path) is None
    light = load_light_llama(path, torch.float32)
    real = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 500, (3, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.tensor([12, 9, 4])
    assert torch.equal(_logits(light, ids, valid), _logits(real, ids, valid))
    assert light.generation_config.to_dict() == real.generation_config.to_dict()
    assert all(not p.requires_grad for p in light.parameters())


def _copy(src: Path, dst: Path, **config) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / "config.json").read_text())
    data.update(config)
    (dst / "config.json").write_text(json.dumps(data))
    return dst


def test_what_needs_the_models_own_class_is_named(tiny, tmp_path):
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert "rotary" in refusal(_copy(tiny, tmp_path / "a", rope_parameters=scaled))
    assert "Llama" in refusal(_copy(tiny, tmp_path / "b", model_type="mistral"))
    assert "quantized" in refusal(_copy(tiny, tmp_path / "c", quantization_config={"bits": 4}))
    sharded = _copy(tiny, tmp_path / "d")
    (sharded / "model.safetensors.index.json").write_text("{}")
    assert "one model.safetensors" in refusal(sharded)


def test_the_hf_backend_falls_back_to_the_real_class(tiny, tmp_path):
    """A generation setting the static engine has no processor for: generate answers, with
    the checkpoint loaded as transformers' class; a tensor the light loader does not know:
    the same."""
    from safetensors.torch import load_file, save_file

    from kgsynth.llm.hf_backend import HFLLM

    odd = _copy(tiny, tmp_path / "odd")
    gen = json.loads((odd / "generation_config.json").read_text())
    (odd / "generation_config.json").write_text(json.dumps({**gen, "repetition_penalty": 1.3}))
    llm = HFLLM(str(odd), device="cpu")
    out = llm.generate([{"role": "user", "content": "who directed Kismet?"}], max_tokens=4)
    assert out.ok and llm._decoder is False and hasattr(llm._model, "generate")

    extra = _copy(tiny, tmp_path / "extra")
    state = load_file(str(extra / "model.safetensors"))
    save_file({**state, "model.unknown.weight": torch.zeros(2)}, str(extra / "model.safetensors"))
    with pytest.raises(ValueError, match="no place for"):
        load_light_llama(extra)
    llm = HFLLM(str(extra), device="cpu")
    llm._load()
    assert hasattr(llm._model, "generate")
