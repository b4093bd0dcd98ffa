"""Trajectory messages -> token ids and one loss mask, shared by SFT and GRPO.

The conversation is rendered with the tokenizer's chat template (:data:`CHATML_TEMPLATE` when
it has none);
environment observations (``tool`` messages) are rendered as ``user`` turns, exactly as the
agent loop sends them to the policy. The loss mask is 1 on the tokens of assistant messages
(their content and the end-of-turn token that closes them: think, kg-query, answer) and 0 on
everything else — system, user, observations and the role headers — so training never fits
text the model did not write (GraphWalker Eq. 2, KnowCoder-A1 Eq. 5, KBQA-R1 IV-B2). An
assistant message with ``"train": False`` is context, not a target: its tokens get 0 too (a
recovery trajectory's wrong step: benchmarks/recoveries.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.llm.chat import CHATML_TEMPLATE, IM_END, IM_START, chat_template


@dataclass(frozen=True)
class Rendered:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is the agent's own
    text: str

    def __len__(self) -> int:
        return len(self.input_ids)


def for_template(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Messages as the policy sees them: observations as ``user`` turns."""
    return [
        {"role": "user" if m["role"] == "tool" else m["role"], "content": str(m["content"])}
        for m in messages
    ]


def chat_text(
    tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False
) -> str:
    """``messages`` as the policy reads them (SFT's samples and GRPO's rollouts alike)."""
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        chat_template=chat_template(tokenizer),
    )


def trained(message: dict[str, Any]) -> bool:
    """Whether the loss covers ``message``: an assistant message not marked ``"train": False``."""
    return message["role"] == "assistant" and message.get("train", True) is not False


def assistant_spans(
    tokenizer: Any, messages: Sequence[dict[str, Any]]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans the loss covers.

    Each message's segment is found by rendering growing prefixes of the conversation (chat
    templates render a conversation as the concatenation of its turns); inside a trained
    assistant segment (:func:`trained`) the span runs from its content to the end of the
    end-of-turn token after it."""
    targets = [trained(m) for m in messages]
    msgs = for_template(messages)
    eos = getattr(tokenizer, "eos_token", None) or ""
    if chat_template(tokenizer) == CHATML_TEMPLATE:
        return _chatml_spans(msgs, eos, targets)
    text = chat_text(tokenizer, msgs)
    spans: list[tuple[int, int]] = []
    prev = 0
    for i, m in enumerate(msgs):
        upto = chat_text(tokenizer, msgs[: i + 1])
        if not text.startswith(upto):
            raise ValueError("the chat template does not render conversations turn by turn")
        if targets[i]:
            start = upto.find(m["content"], prev)
            if start < 0:
                raise ValueError("assistant content not found verbatim in the rendered turn")
            end = start + len(m["content"])
            if eos and upto.startswith(eos, end):
                end += len(eos)
            spans.append((start, end))
        prev = len(upto)
    return text, spans


def _chatml_spans(
    msgs: list[dict[str, str]], eos: str, targets: list[bool]
) -> tuple[str, list[tuple[int, int]]]:
    """:func:`assistant_spans` for :data:`CHATML_TEMPLATE`, whose rendering is known: each turn
    is ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``, so the text is built once instead of
    rendering every prefix through jinja (the same text and spans; tests compare the two)."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for m, target in zip(msgs, targets, strict=True):
        head = f"{IM_START}{m['role']}\n"
        turn = f"{head}{m['content']}{IM_END}\n"
        if target:
            start = pos + len(head)
            end = start + len(m["content"])
            if eos and turn.startswith(eos, end - pos):
                end += len(eos)
            spans.append((start, end))
        parts.append(turn)
        pos += len(turn)
    return "".join(parts), spans


def render_messages(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> Rendered:
    """Token ids of the whole conversation and the loss mask over them."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    k = 0
    for a, b in enc["offset_mapping"]:
        while k < len(spans) and spans[k][1] <= a:
            k += 1
        inside = k < len(spans) and a >= spans[k][0] and b <= spans[k][1] and b > a
        mask.append(1 if inside else 0)
    return Rendered(list(enc["input_ids"]), mask, text)
