"""Copy probe: how well a policy predicts the names it must copy from its context.

An agent's tool calls and answers are mostly names it has read: the topic entity in its first
call, the entities of an observation in the next call or the answer. A model that has not learnt
to copy writes fragments there (``get_relations("The ")``) however low its average loss. This
module measures exactly that: the mean negative log-likelihood of the tokens of each quoted
string inside an assistant's ``<kg-query>`` or ``<answer>`` whose text already appeared earlier in
the conversation::

    from kgsynth.train.probe import copy_loss
    copy_loss(model, tokenizer, conversations)  # nats per copied token

SFT logs it before and after training (``train_summary.json``), on trajectories held out of the
optimisation, so a falling value means copying learnt, not names memorised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from kgsynth.agent.protocol import ACTION_TAGS
from kgsynth.agent.render import assistant_spans

_ACTION = re.compile(f"<({'|'.join(ACTION_TAGS)})>(.*?)</\\1>", re.DOTALL)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)+)"')


def copy_char_spans(
    text: str, spans: Sequence[tuple[int, int]], *, seen_only: bool = True
) -> list[tuple[int, int]]:
    """Character spans of the copied names: quoted strings inside the actions of the assistant
    ``spans`` of ``text`` whose content occurs in ``text`` before that assistant turn (every
    quoted string with ``seen_only=False``: the control where there is nothing to copy)."""
    out = []
    for start, end in spans:
        for action in _ACTION.finditer(text, start, end):
            body_start = action.start(2)
            for q in _QUOTED.finditer(action.group(2)):
                if not seen_only or q.group(1) in text[:start]:
                    out.append((body_start + q.start(1), body_start + q.end(1)))
    return out


def copy_targets(
    tokenizer: Any, messages: Sequence[dict[str, Any]], *, seen_only: bool = True
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask of the copied-name tokens."""
    text, spans = assistant_spans(tokenizer, messages)
    names = copy_char_spans(text, spans, seen_only=seen_only)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for a, b in enc["offset_mapping"]:
        mask.append(int(b > a and any(s <= a and b <= e for s, e in names)))
    return list(enc["input_ids"]), mask


def copy_loss(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Sequence[dict[str, Any]]],
    *,
    batch_size: int = 8,
    seen_only: bool = True,
) -> float | None:
    """Mean NLL (nats) of the copied-name tokens over ``conversations``; None if there are none.
    ``seen_only=False`` scores every quoted name of the actions (see :func:`copy_char_spans`)."""
    import torch

    rows = [copy_targets(tokenizer, c, seen_only=seen_only) for c in conversations]
    rows = [r for r in rows if any(r[1])]
    if not rows:
        return None
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attn = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.bool)
            for j, (tok, m) in enumerate(chunk):
                ids[j, : len(tok)] = torch.tensor(tok)
                attn[j, : len(tok)] = 1
                mask[j, : len(m)] = torch.tensor(m, dtype=torch.bool)
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            target = ids[:, 1:].to(device)
            nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            sel = mask[:, 1:].to(device)
            total += float(nll[sel].sum())
            count += int(sel.sum())
    if was_training:
        model.train()
    return total / count if count else None


def copy_accuracy_bound(loss: float | None) -> float | None:
    """exp(-loss): the geometric-mean probability of a copied token (1.0 = copies perfectly)."""
    return None if loss is None else math.exp(-loss)
