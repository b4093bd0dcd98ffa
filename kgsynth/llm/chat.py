"""The one chat template: ChatML, as Qwen2 writes it (:data:`CHATML_TEMPLATE`), for a tokenizer
that has none. The hf backend's prompts, the renderer of SFT and GRPO (:mod:`kgsynth.agent.render`)
and the tiny model's tokenizer all use it. It renders ``tool`` messages as ``user`` turns and
marks the tokens kgsynth's SFT trains on with ``{% generation %}``, so TRL's
``assistant_only_loss=True`` trains a kgsynth corpus as kgsynth does (docs/corpus-format.md)."""

from __future__ import annotations

from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# The one chat template: ChatML, as Qwen2 writes it. The renderer, the GRPO sampler and SFT fall
# back to it for a tokenizer without one, and the tiny model's tokenizer carries it. Content may
# be a string or a list of text parts (the OpenAI message shape, as ``transformers serve``
# passes it); add_generation_prompt opens the assistant turn.
#
# Two choices make it render what kgsynth's own SFT trains on (docs/corpus-format.md):
# - a ``tool`` message (an environment observation) is a ``user`` turn, as the agent loop sends
#   it to the policy and as :func:`kgsynth.agent.render.for_template` maps it;
# - ``{% generation %}`` … ``{% endgeneration %}`` wrap exactly the tokens kgsynth's loss mask
#   covers (an assistant turn's content and its ``<|im_end|>``, not the header or the newline
#   after it), so ``apply_chat_template(..., return_assistant_tokens_mask=True)`` and TRL's
#   ``assistant_only_loss=True`` mask the same tokens. The markers render nothing.
CHATML_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}"
    "{{- content -}}"
    "{%- elif content is not none -%}"
    "{%- for part in content -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'user' if message['role'] == 'tool' else message['role'] -%}"
    "{{- '<|im_start|>' + role + '\\n' -}}"
    "{%- if role == 'assistant' -%}"
    "{%- generation -%}"
    "{{- render_content(message['content']) + '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- render_content(message['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def chat_template(tokenizer: Any) -> str:
    """The chat template a policy is rendered with: its tokenizer's, else the ChatML one."""
    return getattr(tokenizer, "chat_template", None) or CHATML_TEMPLATE
