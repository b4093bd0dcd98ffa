"""A tiny causal LM built fully offline, for tests, smoke runs and benchmarks.

texts -> a ``save_pretrained`` folder (Llama architecture, random weights, a byte-level BPE
tokenizer trained on the texts) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` reload, that
``HFLLM`` and ``transformers serve`` can generate from, and that SFT/GRPO can train::

    from kgsynth.train.tiny import build_tiny_model

    model_dir = build_tiny_model(["who directed Kismet?", ...], "runs/tiny")

The tokenizer knows a ChatML chat template (``<|im_start|>role\\n…<|im_end|>``) and holds the
agent protocol tags (``<think>``, ``<kg-query>``, ``<answer>``, ``<information>`` and their
closing tags) as single added tokens, so loss masks and stop strings line up with token
boundaries as they do for a real Qwen-style model. Nothing is downloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from kgsynth.agent.protocol import PROTOCOL_TAGS
from kgsynth.llm.chat import CHATML_TEMPLATE, IM_END, IM_START

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END)

# The pre-tokenizer split. Qwen's and GPT's splits glue a leading space or quote to a word, so a
# name is " Adam" after a colon but "Adam" after `("`: two unrelated token ids, and a tiny model
# would have to learn that mapping for every word of every name before it can copy a name from
# its context into a tool call or an answer. Here a word keeps a *trailing* space instead; what
# precedes it never changes its tokens, so a name is the same token sequence wherever it appears
# (question, topic line, observation, tool call, answer) and copying is position-for-position.
# Digits are split one by one, as in Qwen.
COPY_SPLIT_REGEX = r"\p{L}+ ?|\p{N}|[^\s\p{L}\p{N}]+ ?|\s*[\r\n]+|\s+"

# The tokenizer carries the one ChatML template the renderer uses.
CHAT_TEMPLATE = CHATML_TEMPLATE


def build_tiny_model(
    texts: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 2000,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    max_position: int = 2048,
    seed: int = 0,
    init_std: float = 0.1,
) -> Path:
    """Train a tokenizer on ``texts``, build a randomly initialised Llama-architecture model, save
    both.

    ``vocab_size`` caps the BPE vocabulary (fewer texts give fewer merges; the model's
    embedding matrix matches the tokenizer's real size). ``hidden_size`` must be a multiple of
    ``2 * num_heads`` (rotary embeddings need an even head size). ``num_kv_heads`` (default
    ``num_heads``) below ``num_heads`` shares each key-value head among ``num_heads //
    num_kv_heads`` query heads (grouped-query attention: a KV cache that many times smaller).
    The same texts and ``seed`` give the same weights. ``init_std`` is the weights' normal-init
    spread: Qwen's own 0.02 leaves the tied embeddings dominant, so greedy decoding just repeats
    the prompt's last token (the newline after ``<|im_start|>assistant``) and a server strips
    the answer to an empty string; at 0.1 the output varies with the prompt. Returns ``out_dir`` as a
    :class:`Path`.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if num_heads < 1 or hidden_size % (2 * num_heads):
        raise ValueError(
            f"hidden_size ({hidden_size}) must be a positive multiple of 2 * num_heads ({num_heads})"
        )
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({kv_heads})")
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (got {vocab_size})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(texts, vocab_size),
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_position,
        clean_up_tokenization_spaces=False,
    )

    torch.manual_seed(seed)
    # Llama, not Qwen2: transformers loads every qwen2 checkpoint's tokenizer as Qwen2Tokenizer,
    # which rebuilds it with Qwen's own split and would undo COPY_SPLIT_REGEX; a llama
    # checkpoint's tokenizer.json is loaded as saved (by transformers and by vLLM alike).
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position,
        initializer_range=init_std,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info(
        "tiny model: %d parameters, vocabulary %d, saved to %s",
        sum(p.numel() for p in model.parameters()),
        len(tokenizer),
        out,
    )
    return out


def _train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer trained on ``texts``: split by :data:`COPY_SPLIT_REGEX`,
    with :data:`SPECIAL_TOKENS` and the protocol tags added."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(COPY_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    # Not "special": decoding with skip_special_tokens=True keeps them, as the agent's parser
    # needs (Qwen marks <think> the same way).
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in PROTOCOL_TAGS])
    return backend
