"""kgsynth.train.tiny: a tiny Llama-architecture model and tokenizer built offline reload, tokenize the agent
protocol tags as single tokens, render ChatML and generate through the hf backend."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.llm.base import Completion
from kgsynth.llm.hf_backend import HFLLM
from kgsynth.train.tiny import IM_END, IM_START, PAD_TOKEN, PROTOCOL_TAGS, build_tiny_model

TEXTS = [
    "who directed Kismet? <think>Find the director.</think>",
    '<kg-query>get_relations("Kismet")</kg-query>',
    "<information>directed_by, starred_actors, release_year</information>",
    '<answer>["Vincente Minnelli"]</answer>',
    "The Matrix was released in 1999 and starred Keanu Reeves.",
    "Amélie was filmed in Paris; Ōkami was directed by Hideki Kamiya.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.monotonic()
    out = build_tiny_model(TEXTS, tmp_path_factory.mktemp("tiny") / "model")
    assert time.monotonic() - started < 30
    return out


def test_saved_folder_reloads_with_auto_classes(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.model_type == "llama"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tok)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert (tok.eos_token, tok.pad_token) == (IM_END, PAD_TOKEN)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert sum(p.numel() for p in model.parameters()) < 500_000


def test_protocol_tags_and_chat_tokens_are_single_tokens(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for tag in (*PROTOCOL_TAGS, IM_START, IM_END):
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, (tag, ids)
        assert tok.convert_ids_to_tokens(ids[0]) == tag
    text = 'x<think>plan</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<think>") in ids
    assert tok.convert_tokens_to_ids("</kg-query>") == ids[-1]
    # protocol tags are not "special": generated text keeps them when specials are skipped
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok.encode(f"{IM_START}a{IM_END}"), skip_special_tokens=True) == "a"


def test_saved_tokenizer_json_agrees_with_the_reloaded_tokenizer(model_dir: Path) -> None:
    # AutoTokenizer must load tokenizer.json as trained (it rebuilds qwen2 tokenizers with
    # Qwen's own split, which is why the tiny model is a llama).
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in [*TEXTS, "Ame\u0301lie 1955  two  spaces\nnew line 😀", ""]:
        assert tok.encode(text, add_special_tokens=False) == raw.encode(text).ids
        assert tok.decode(raw.encode(text).ids) == tok.backend_tokenizer.normalizer.normalize_str(
            text
        )


def test_a_name_is_the_same_tokens_wherever_it_appears(model_dir: Path) -> None:
    # the copy the agent must learn: topic line -> tool call -> observation -> answer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    name = "Bette Davis"
    ids = tok.encode(name, add_special_tokens=False)
    contexts = [
        f"Topic entities: {name}\n",
        f'<kg-query>get_relations("{name}")</kg-query>',
        f"(Kismet, starred_actors, {name})\n",
        f'<answer>["Kismet", "{name}"]</answer>',
        f"who is {name}?",
    ]
    for text in contexts:
        got = tok.encode(text, add_special_tokens=False)
        assert any(got[i : i + len(ids)] == ids for i in range(len(got))), text


def test_chat_template_renders_chatml(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = [
        {"role": "system", "content": "Answer with the KG."},
        {"role": "user", "content": "who directed Kismet?"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nAnswer with the KG.<|im_end|>\n"
        "<|im_start|>user\nwho directed Kismet?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    closed = tok.apply_chat_template(
        [*messages, {"role": "assistant", "content": "<answer>[]</answer>"}], tokenize=False
    )
    assert closed.endswith("<|im_start|>assistant\n<answer>[]</answer><|im_end|>\n")
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert tok.apply_chat_template(parts, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    assert tok.decode(enc["input_ids"]) == text


def test_same_texts_and_seed_give_the_same_weights(model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    again = build_tiny_model(TEXTS, tmp_path / "again")
    other = build_tiny_model(TEXTS, tmp_path / "other", seed=1)
    first = load_file(model_dir / "model.safetensors")
    assert all((first[k] == v).all() for k, v in load_file(again / "model.safetensors").items())
    assert any((first[k] != v).any() for k, v in load_file(other / "model.safetensors").items())
    assert (again / "tokenizer.json").read_text() == (model_dir / "tokenizer.json").read_text()


def test_hf_backend_generates_from_the_tiny_model(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "who directed Kismet?"}]
    prompt = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    llm = HFLLM(str(model_dir), device="cpu")
    c = llm.generate(messages, max_tokens=8)
    llm.close()
    assert isinstance(c, Completion) and c.ok
    assert isinstance(c.text, str) and c.text.strip()
    assert 0 < c.completion_tokens <= 8
    assert c.prompt_tokens == len(prompt)


def test_two_generation_workers_answer_as_one_process(model_dir: Path) -> None:
    """`--workers 2` (hf on CPU): the same completions as one process, greedy and seeded
    sampling alike, in request order; batches of several parameter sets are kept apart."""
    from kgsynth.llm.base import GenerationParams, Request

    greedy = GenerationParams(max_tokens=6, temperature=0.0)
    sampled = GenerationParams(max_tokens=6, temperature=1.0, seed=3)
    requests = [
        Request.make([{"role": "user", "content": f"{TEXTS[i % len(TEXTS)]} {i}"}], p)
        for i in range(7)
        for p in (greedy, sampled)
    ]
    one = HFLLM(str(model_dir), device="cpu", batch_size=3, engine="hf")
    two = HFLLM(str(model_dir), device="cpu", batch_size=3, workers=2, engine="hf")
    try:
        expected = one.generate_batch(requests)
        seen: list[int] = []
        got = two.generate_batch(requests, progress=lambda i, _c: seen.append(i))
        again = two.generate_batch(requests[:4])  # the pool serves later calls too
        expected_again = one.generate_batch(requests[:4])
        assert two._pool is not None
    finally:
        one.close()
        two.close()
    assert [c.text for c in got] == [c.text for c in expected]
    assert [c.completion_tokens for c in got] == [c.completion_tokens for c in expected]
    assert all(c.ok for c in got) and sorted(seen) == list(range(len(requests)))
    assert [c.text for c in again] == [c.text for c in expected_again]
    assert two.stats.requests == len(requests) + 4 and two.workers == 2
    with pytest.raises(ConfigError, match="--workers"):
        HFLLM(str(model_dir), workers=0)


def test_two_workers_with_the_static_engine_decode_in_one_process_on_every_core(
    model_dir: Path,
) -> None:
    """`--workers 2` where the static engine runs: no pool; this process decodes with torch on
    every core while it generates (one thread again after), and answers as one worker does."""
    import torch

    from kgsynth.llm.base import GenerationParams, Request

    params = GenerationParams(max_tokens=6, temperature=1.0, seed=5)
    requests = [Request.make([{"role": "user", "content": t}], params) for t in TEXTS]
    one = HFLLM(str(model_dir), device="cpu", batch_size=2)
    two = HFLLM(str(model_dir), device="cpu", batch_size=2, workers=2)
    threads_seen: list[int] = []
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = one.generate_batch(requests)
        got = two.generate_batch(requests, progress=lambda *_: threads_seen.append(
            torch.get_num_threads()))  # fmt: skip
        assert two._pool is None and two._static() is not None
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        one.close()
        two.close()
    assert [c.text for c in got] == [c.text for c in expected]
    assert set(threads_seen) == {max(1, os.cpu_count() or 1)}


def test_a_checkpoint_is_cached_by_its_files_not_its_path(model_dir: Path, tmp_path: Path) -> None:
    """The request cache knows a local checkpoint by the digest of the files it generates
    from: a copy at another path (a stage that kept its start's weights) answers from the
    start's entries, with other run records beside it; retrained weights at the first path,
    another chat template or another batch size miss."""
    import shutil

    from safetensors.torch import load_file, save_file

    from kgsynth.llm.cache import CachedLLM

    first = tmp_path / "stage1"
    shutil.copytree(model_dir, first)
    (first / "train_summary.json").write_text('{"steps": 10}')
    kept = tmp_path / "stage2"
    shutil.copytree(model_dir, kept)
    (kept / "selection.json").write_text('{"chosen_step": 0}')
    (kept / "loss.png").write_bytes(b"png")
    messages = [{"role": "user", "content": "who directed Kismet?"}]

    def ask(folder: Path, **options: object) -> tuple[Completion, int]:
        inner = HFLLM(str(folder), device="cpu", **options)  # type: ignore[arg-type]
        cached = CachedLLM(inner, tmp_path / "cache.sqlite")
        try:
            return cached.generate(messages, max_tokens=6), inner.stats.requests
        finally:
            cached.close()

    made, requests = ask(first)
    assert requests == 1 and not made.cached
    reused, requests = ask(kept)
    assert requests == 0 and reused.cached and reused.text == made.text
    _, requests = ask(kept, batch_size=4)
    assert requests == 1
    template = kept / "chat_template.jinja"
    template.write_text(template.read_text() + " ")
    _, requests = ask(kept)
    assert requests == 1
    weights = load_file(first / "model.safetensors")
    save_file({k: v + 0.01 for k, v in weights.items()}, first / "model.safetensors")
    _, requests = ask(first)
    assert requests == 1


def test_rejects_a_head_size_rotary_embeddings_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        build_tiny_model(TEXTS, tmp_path / "bad", hidden_size=60, num_heads=4)


def test_key_value_heads_divide_the_query_heads(tmp_path: Path) -> None:
    from transformers import AutoConfig

    out = build_tiny_model(TEXTS, tmp_path / "gqa", hidden_size=32, num_heads=4, num_kv_heads=2)
    assert AutoConfig.from_pretrained(out).num_key_value_heads == 2
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_tiny_model(TEXTS, tmp_path / "bad", hidden_size=32, num_heads=4, num_kv_heads=3)
