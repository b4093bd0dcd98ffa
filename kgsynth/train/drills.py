"""Copy drills: short conversations that exercise the one skill a model trained from scratch lacks.

A pretrained LLM arrives able to copy a string it has read; a tiny model built from a config
does not, and until it can, every tool call and answer it writes is a fragment of a name. The
agent trajectories teach copying slowly (a few copied names among hundreds of tokens), so the
tiny recipe mixes in drills made from the names of the training corpus itself — the entities of
its observations — each a few dozen tokens whose assistant turn is nothing but copies, in the
forms the agent uses::

    user:      Names: Kismet; Vincente Minnelli
    assistant: <answer>["Kismet", "Vincente Minnelli"]</answer>

    user:      <information>(Kismet, directed_by, Vincente Minnelli)</information>
    assistant: <answer>["Vincente Minnelli"]</answer>

    user:      Topic entities: Kismet
    assistant: <kg-query>get_relations("Kismet")</kg-query>

Two uses: mixed into the trajectories (``copy_drills``), or as a warm-up before them
(:func:`warm_up`, ``copy_warmup_steps``): a minute of dense drills forms the attention pattern
that copies (look up where the current token occurred before, emit what followed it), which
the trajectories alone take many minutes to form. Drills carry their own system line (``DRILL_SYSTEM``), so they never pose as agent episodes and
the checkpoint's stored agent prompt stays the trajectories' one. Only the corpus is read: no
evaluation question or answer is involved.

What an observation shows and how a drill's observation, tool call and answer read are the
corpus's action space's (``ActionSpace.observed``, ``drill_observation``, ``drill_call``,
``drill_action``, ``drill_answer``; isp writes ``<node>Kismet</node>`` and boxed answers): the space
its trajectories were made in, as the corpus's manifests carry it (:func:`corpus_toolset`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kgsynth.agent.protocol import render_observation
from kgsynth.agent.spaces.registry import space

DRILL_SYSTEM = "Copy the names exactly as they are written."


def corpus_toolset(corpus: str | Path, init: str | Path | None = None) -> str | None:
    """The tool set the trajectories of ``corpus`` were made in, as its manifests (or, where
    they say nothing, ``init``'s agent settings) carry it
    (:func:`kgsynth.agent.carried.sft_agent`); None where nothing says."""
    from kgsynth.agent.carried import sft_agent

    carried = sft_agent(corpus, init)
    return carried.values.get("toolset") if carried is not None else None


def observed_names(
    conversations: Sequence[Sequence[dict[str, str]]], toolset: str | None = None
) -> tuple[list[str], list[str]]:
    """The entity names and relations the corpus's observations show, as the action space
    ``toolset`` reads them (``ActionSpace.observed``; None: the default space's), each in
    first-seen order (``?`` placeholders and names a drill could not quote are left out)."""
    actions = space(toolset)
    names: dict[str, None] = {}
    relations: dict[str, None] = {}
    for conv in conversations:
        for m in conv:
            if m["role"] != "tool":
                continue
            seen = actions.observed(m["content"])
            for name in seen.names:
                if name and name != "?" and '"' not in name and name.strip() == name:
                    names.setdefault(name, None)
            relations.update(dict.fromkeys(seen.relations))
    return list(names), list(relations)


def copy_drills(
    conversations: Sequence[Sequence[dict[str, str]]],
    n: int,
    seed: int = 0,
    toolset: str | None = None,
) -> list[list[dict[str, str]]]:
    """``n`` drill conversations built from the corpus's own entity names (none if it shows
    fewer than two names), its observations read and its drills written as the action space
    ``toolset`` (the corpus's: :func:`corpus_toolset`; None: the default space) reads and
    writes them."""
    names, rels = observed_names(conversations, toolset)
    if n <= 0 or len(names) < 2:
        return []
    actions = space(toolset)
    rels = rels or ["related_to"]
    rng = random.Random(f"copy-drills|{seed}")
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            picked = rng.sample(names, min(len(names), rng.randint(1, 4)))
            user = "Names: " + "; ".join(picked)
            reply = actions.drill_answer(picked)
        elif kind == 1:
            head = rng.choice(names)
            rel = rng.choice(rels)
            tails = rng.sample(names, min(len(names), rng.randint(1, 4)))
            user = render_observation(actions.drill_observation(head, rel, tails))
            reply = actions.drill_answer(tails)
        else:
            topic = rng.choice(names)
            user = f"Topic entities: {topic}"
            reply = actions.drill_action(actions.drill_call(topic, rels, rng))
        out.append(
            [
                {"role": "system", "content": DRILL_SYSTEM},
                {"role": "user", "content": user},
                {"role": "assistant", "content": reply},
            ]
        )
    return out


def _all_reduce_grads(model: Any) -> None:
    """Sum every gradient over the processes, in one flat buffer."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def warm_up(
    model: Any,
    tokenizer: Any,
    drills: Sequence[Sequence[dict[str, str]]],
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 2.5e-3,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
    target: float | None = None,
    max_steps: int | None = None,
    masked_logits: bool = False,
) -> dict[str, Any]:
    """Train ``model`` in place on copy drills for ``steps`` AdamW steps (batches of
    ``batch_size`` drills, loss on the assistant turn only, linear warmup over the first 5 %),
    before the trajectories. With ``target`` and ``max_steps``, a warm-up whose loss over the
    last tenth of ``steps`` is still above ``target`` goes on, checked every tenth of
    ``steps``, until it is at the target or ``max_steps`` steps are done (the loss falls
    steadily, faster on some drill orders than on others). Returns what it did, for the run's
    summary."""
    import time

    import torch

    from kgsynth.train.core import all_sum, rank_and_world
    from kgsynth.train.data import IGNORE_INDEX, to_sample
    from kgsynth.train.sft_trainer import labelled_positions

    samples = [to_sample(tokenizer, d) for d in drills]
    rank, world = rank_and_world()
    if batch_size < world:  # too few drills to share: every process takes the whole batch
        rank, world = 0, 1
    rng = random.Random(f"warm-up|{seed}")
    device = next(model.parameters()).device

    def total(values: list[float]) -> list[float]:
        """Summed over the processes sharing the batch, on the model's device (NCCL reduces
        only CUDA tensors)."""
        return all_sum(values, device=str(device)) if world > 1 else values

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    model.train()
    started = time.perf_counter()
    tokens = 0
    losses: list[float] = []
    tenth = max(1, steps // 10)
    limit = max(steps, max_steps or 0) if target is not None else steps
    step = 0
    while step < limit:
        checked = target is not None and step >= steps and step % tenth == 0
        if checked and sum(losses[-tenth:]) / tenth <= target:  # type: ignore[operator]
            break
        batch = [samples[rng.randrange(len(samples))] for _ in range(batch_size)]
        batch = batch[rank::world]  # every process draws the same batch and takes its share
        width = max(len(s.input_ids) for s in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        for j, s in enumerate(batch):
            ids[j, : len(s.input_ids)] = torch.tensor(s.input_ids)
            labels[j, : len(s.labels)] = torch.tensor(s.labels)
        # right padding and no attention mask: causal attention keeps the real tokens from
        # the padding after them, and the unmasked kernel is the faster one
        labelled = int((labels[:, 1:] != IGNORE_INDEX).sum())  # the loss's targets
        all_tokens, all_labelled = total([sum(len(s.input_ids) for s in batch), labelled])
        tokens += int(all_tokens)
        labels = labels.to(device)
        kwargs: dict[str, Any] = {}
        if masked_logits:
            kwargs["logits_to_keep"], kwargs["shift_labels"] = labelled_positions(labels)
        out = model(input_ids=ids.to(device), labels=labels, **kwargs)
        # the mean over the whole batch's labelled tokens, whichever process holds them
        share = labelled / max(1.0, all_labelled)
        (out.loss * share).backward()
        if world > 1:
            _all_reduce_grads(model)
        (loss,) = total([float(out.loss.detach()) * share])
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        step += 1
        if progress:
            progress(step, losses[-1])
    elapsed = time.perf_counter() - started
    tail = losses[-tenth:]
    return {
        "steps": step,
        "batch_size": batch_size,
        "lr": lr,
        "drills": len(samples),
        "tokens": tokens,
        "seconds": round(elapsed, 2),
        "loss_first": losses[0] if losses else None,
        "loss_last_tenth": sum(tail) / len(tail) if tail else None,
    }
