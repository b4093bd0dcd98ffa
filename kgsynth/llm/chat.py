"""The one chat template: ChatML, as Qwen2 writes it (:data:`CHATML_TEMPLATE`), for a tokenizer
that has none. The hf backend's prompts, the renderer of SFT and GRPO (:mod:`kgsynth.agent.render`)
and the tiny model's tokenizer all use it."""

from __future__ import annotations

from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# The one chat template: ChatML, as Qwen2 writes it. The renderer, the GRPO sampler and SFT fall
# back to it for a tokenizer without one, and the tiny model's tokenizer carries it. Content may
# be a string or a list of text parts (the OpenAI message shape, as ``transformers serve``
# passes it); add_generation_prompt opens the assistant turn.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def chat_template(tokenizer: Any) -> str:
    """The chat template a policy is rendered with: its tokenizer's, else the ChatML one."""
    return getattr(tokenizer, "chat_template", None) or CHATML_TEMPLATE
