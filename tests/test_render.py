"""The renderer and loss mask shared by SFT and GRPO."""

import pytest

from kgsynth.agent.render import render_messages

MESSAGES = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "Question: who directed Kismet?\nTopic entities: Kismet"},
    {
        "role": "assistant",
        "content": '<think>look</think>\n<kg-query>get_triples("Kismet", ["directed_by"])</kg-query>',
    },
    {
        "role": "tool",
        "content": "<information>(Kismet, directed_by, William Dieterle)</information>",
    },
    {"role": "assistant", "content": '<think>found</think>\n<answer>["William Dieterle"]</answer>'},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from kgsynth.train.tiny import build_tiny_model

    texts = [m["content"] for m in MESSAGES] * 3
    path = build_tiny_model(texts, tmp_path_factory.mktemp("tok") / "m", vocab_size=400)
    return AutoTokenizer.from_pretrained(path)


def masked_text(tokenizer, rendered):
    return tokenizer.decode(
        [t for t, m in zip(rendered.input_ids, rendered.loss_mask, strict=True) if m]
    )


def test_mask_covers_exactly_the_assistant_turns(tokenizer):
    r = render_messages(tokenizer, MESSAGES)
    assert len(r.input_ids) == len(r.loss_mask) and set(r.loss_mask) == {0, 1}
    assert (
        masked_text(tokenizer, r)
        == MESSAGES[2]["content"] + "<|im_end|>" + MESSAGES[4]["content"] + "<|im_end|>"
    )
    assert tokenizer.decode(r.input_ids) == r.text
    # observations are rendered as user turns, as the agent loop sends them
    assert "<|im_start|>user\n<information>" in r.text and "<|im_start|>tool" not in r.text


def test_other_text_changes_do_not_touch_masked_tokens(tokenizer):
    a = render_messages(tokenizer, MESSAGES)
    changed = [dict(m) for m in MESSAGES]
    changed[0]["content"] = "A different system prompt, much longer than before."
    changed[3]["content"] = "<information>(Kismet, directed_by, Somebody Else)</information>"
    b = render_messages(tokenizer, changed)
    ma = [t for t, m in zip(a.input_ids, a.loss_mask, strict=True) if m]
    mb = [t for t, m in zip(b.input_ids, b.loss_mask, strict=True) if m]
    assert ma == mb


def test_builtin_template_when_the_tokenizer_has_none(tokenizer):
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    r = render_messages(bare, MESSAGES)
    assert r.text.startswith("<|im_start|>system\n") and sum(r.loss_mask) > 0
    assert masked_text(bare, r) == masked_text(tokenizer, render_messages(tokenizer, MESSAGES))


def test_chatml_fast_path_matches_rendering_every_prefix(tokenizer):
    """The built-in ChatML template is rendered in Python; the same template in any other
    spelling goes through jinja prefix by prefix, and both give the same ids and mask."""
    import copy

    from kgsynth.agent.render import CHATML_TEMPLATE, assistant_spans

    assert tokenizer.chat_template == CHATML_TEMPLATE  # the tiny model takes the fast path
    slow = copy.deepcopy(tokenizer)
    slow.chat_template = CHATML_TEMPLATE + "{# the same template, spelled differently #}"
    longer = [*MESSAGES[:4], *MESSAGES[2:4], MESSAGES[4]]
    for messages in (MESSAGES, longer, MESSAGES[:3]):
        assert assistant_spans(tokenizer, messages) == assistant_spans(slow, messages)
        fast_r, slow_r = render_messages(tokenizer, messages), render_messages(slow, messages)
        assert (fast_r.input_ids, fast_r.loss_mask) == (slow_r.input_ids, slow_r.loss_mask)


def test_the_hf_backend_prompts_a_tokenizer_without_a_template_in_chatml(tokenizer):
    """The hf backend renders its prompt as the renderer does: with the tokenizer's template,
    else ChatML (a tokenizer without one used to fail in apply_chat_template)."""
    import copy

    from kgsynth.llm.base import Request
    from kgsynth.llm.hf_backend import HFLLM

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    backend = HFLLM.__new__(HFLLM)
    request = Request.make(MESSAGES[:2])
    for tok in (tokenizer, bare):
        backend._tok = tok
        prompt = backend._prompt(request)
        assert prompt.startswith("<|im_start|>system\nYou answer with tools.<|im_end|>\n")
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_an_assistant_turn_marked_not_trained_is_context_only(tokenizer):
    """``"train": False`` (a recovery's wrong step) takes that turn out of the loss, on the
    ChatML fast path and through jinja alike; the text and ids do not change."""
    import copy

    from kgsynth.agent.render import CHATML_TEMPLATE

    marked = [dict(m) for m in MESSAGES]
    marked[2]["train"] = False
    slow = copy.deepcopy(tokenizer)
    slow.chat_template = CHATML_TEMPLATE + "{# spelled differently #}"
    for tok in (tokenizer, slow):
        plain, r = render_messages(tok, MESSAGES), render_messages(tok, marked)
        assert (r.input_ids, r.text) == (plain.input_ids, plain.text)
        assert masked_text(tok, r) == MESSAGES[4]["content"] + "<|im_end|>"
        assert sum(r.loss_mask) < sum(plain.loss_mask)


def test_the_corpus_reader_keeps_the_not_trained_mark(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.train.data import read_corpus

    msg = pa.struct([("role", pa.string()), ("content", pa.string()), ("train", pa.bool_())])
    rows = [[{**m, "train": (False if i == 2 else None)} for i, m in enumerate(MESSAGES)]]
    pq.write_table(
        pa.table({"messages": pa.array(rows, type=pa.list_(msg))}), tmp_path / "c.parquet"
    )
    (conv,) = read_corpus(tmp_path / "c.parquet")
    assert [m.get("train") for m in conv] == [None, None, False, None, None]
    assert [m["content"] for m in conv] == [m["content"] for m in MESSAGES]
