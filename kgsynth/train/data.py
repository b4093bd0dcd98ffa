"""SFT data: trajectory rows -> rendered samples -> packed (or length-bucketed) training rows.

``corpus/accepted.parquet`` (or any file with a ``messages`` column of ``{role, content}``
lists, e.g. ``trajectories.parquet``) -> :class:`Sample` (token ids + ``labels``) ->
:class:`PackedRow` (one or more samples laid end to end) -> a collated batch.

Rules, stated once:

- Rendering and the loss mask come from :func:`kgsynth.agent.render.render_messages`, the one
  renderer GRPO uses too. ``labels`` are the token ids where the mask is 1 (assistant
  content and its end-of-turn token) and ``-100`` everywhere else, so system, user and
  observation tokens contribute nothing to the loss. The first token of every sample is
  ``-100`` as well, so in a packed row no sample is asked to predict its neighbour's start.
- Over-long samples (more than ``max_length`` tokens) are **dropped, never truncated**: a
  trajectory cut short either loses its final answer or its question, and both teach the
  wrong thing. Dropped samples are counted (``dropped_overlong``); so are samples without a
  single assistant token (``dropped_no_assistant``). A corpus that loses every sample is an
  error.
- Packing (default for the tiny model): samples are placed first-fit-decreasing into rows of
  at most ``max_length`` tokens; a sample is never split. Each sample's ``position_ids``
  restart at 0 and no attention mask is passed, which transformers (5.x) turns into a
  block-diagonal causal mask for eager/SDPA attention and into varlen kernels for
  FlashAttention: packed samples never attend to each other (tests check this). That holds
  only without a KV cache (transformers skips the detection when one is passed), so training
  runs with ``use_cache=False``.
- Without packing (default for the seed recipe, so ``batch_size`` counts trajectories as in
  the papers), every row is one sample, and the trainer's length-grouped sampler batches
  samples of similar length together.
- Batches are right-padded to their longest row (to a multiple of ``pad_to_multiple_of``);
  padding is causal-invisible to real tokens (it comes after them; its positions continue the
  row's last sample) and is ``-100`` in ``labels``. Every batch carries its real and padded token
  counts, so the metrics report the non-padding fraction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgsynth.errors import InputFileError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Sample:
    """One rendered trajectory: token ids and their labels (``-100`` where the mask is 0)."""

    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class PackedRow:
    """Samples laid end to end in one training row."""

    samples: list[Sample] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(s) for s in self.samples)


@dataclass
class DataStats:
    """What became of the corpus rows; stored in the manifest."""

    rows: int = 0
    samples: int = 0
    dropped_overlong: int = 0
    dropped_no_assistant: int = 0
    tokens: int = 0  # tokens of the kept samples
    loss_tokens: int = 0  # of which carry a label
    longest: int = 0
    training_rows: int = 0
    packed_fill: float = 0.0  # kept tokens / (training_rows * max_length) when packing

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_corpus(path: str | Path) -> list[list[dict[str, str]]]:
    """The ``messages`` of every row of a trajectory Parquet file, validated.

    Errors name the file, the row and what is wrong (missing column, an unknown role, no
    assistant turn is fine here: it is counted and dropped later)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "does not exist (run `kgsynth filter` or point at a corpus)")
    try:
        table = pq.read_table(path, columns=["messages"])
    except (pa.ArrowException, OSError) as exc:
        msg = str(exc).splitlines()[0]
        if "messages" in msg or "No match for FieldRef" in msg:
            raise InputFileError(path, "has no 'messages' column (a trajectory file)") from None
        raise InputFileError(path, f"is not a readable Parquet file: {msg}") from None
    out: list[list[dict[str, str]]] = []
    for i, messages in enumerate(table.column("messages").to_pylist()):
        if not messages:
            raise InputFileError(path, f"row {i}: 'messages' is empty")
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or m.get("content") is None:
                raise InputFileError(
                    path,
                    f"row {i}, message {j}: needs role in {sorted(ROLES)} and a content string",
                )
        out.append([{"role": m["role"], "content": m["content"]} for m in messages])
    if not out:
        raise InputFileError(path, "has no rows")
    return out


def corpus_texts(conversations: Iterable[Sequence[dict[str, str]]]) -> list[str]:
    """Message contents, the text a locally trained tokenizer learns from."""
    return [m["content"] for conv in conversations for m in conv]


def to_sample(tokenizer: Any, messages: Sequence[dict[str, str]]) -> Sample:
    """Render one conversation; labels follow the renderer's loss mask."""
    from kgsynth.agent.render import render_messages

    r = render_messages(tokenizer, messages)
    labels = [t if m else IGNORE_INDEX for t, m in zip(r.input_ids, r.loss_mask, strict=True)]
    if labels:
        labels[0] = IGNORE_INDEX
    return Sample(list(r.input_ids), labels)


def build_samples(
    tokenizer: Any, conversations: Sequence[Sequence[dict[str, str]]], max_length: int
) -> tuple[list[Sample], DataStats]:
    """Render every conversation; drop (and count) over-long ones and ones with no labels."""
    stats = DataStats(rows=len(conversations))
    samples: list[Sample] = []
    for conv in conversations:
        s = to_sample(tokenizer, conv)
        if len(s) > max_length:
            stats.dropped_overlong += 1
            continue
        n_loss = sum(1 for x in s.labels if x != IGNORE_INDEX)
        if n_loss == 0:
            stats.dropped_no_assistant += 1
            continue
        samples.append(s)
        stats.tokens += len(s)
        stats.loss_tokens += n_loss
        stats.longest = max(stats.longest, len(s))
    stats.samples = len(samples)
    return samples, stats


def pack_samples(samples: Sequence[Sample], max_length: int) -> list[PackedRow]:
    """First-fit-decreasing bin packing into rows of at most ``max_length`` tokens.

    Deterministic (ties keep corpus order); the trainer's sampler shuffles the rows."""
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i]))
    rows: list[PackedRow] = []
    room: list[int] = []
    for i in order:
        n = len(samples[i])
        for k, free in enumerate(room):
            if n <= free:
                rows[k].samples.append(samples[i])
                room[k] -= n
                break
        else:
            rows.append(PackedRow([samples[i]]))
            room.append(max_length - n)
    return rows


def make_rows(
    samples: Sequence[Sample], max_length: int, packing: bool, stats: DataStats
) -> list[PackedRow]:
    """Training rows: packed, or one sample per row."""
    rows = pack_samples(samples, max_length) if packing else [PackedRow([s]) for s in samples]
    stats.training_rows = len(rows)
    if packing and rows:
        stats.packed_fill = round(stats.tokens / (len(rows) * max_length), 4)
    return rows


def row_features(row: PackedRow) -> dict[str, list[int]]:
    """A row's ``input_ids``, ``labels`` and per-sample ``position_ids``."""
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    for s in row.samples:
        input_ids += s.input_ids
        labels += s.labels
        position_ids += range(len(s))
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


class RowDataset:
    """A map-style dataset over training rows (``torch.utils.data.Dataset`` protocol)."""

    def __init__(self, rows: Sequence[PackedRow]) -> None:
        self.rows = list(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return row_features(self.rows[i])


@dataclass(frozen=True)
class Collator:
    """Right-pads rows to the batch's longest (rounded up to ``pad_to_multiple_of``).

    Padding gets ``pad_token_id``, ``-100`` labels and the positions that continue its row's
    last sample, so a batch of one sample per row has plain increasing positions and runs on
    the causal attention kernel with no mask (padding comes after the real tokens, and causal
    attention keeps them from seeing it); restarting at 0 would make transformers build a
    block mask for a packed batch, 8 % slower on the tiny model (benchmarks/README.md).
    ``num_real_tokens`` and ``num_padded_tokens`` ride along for the metrics; the trainer
    removes them before the forward pass."""

    pad_token_id: int
    pad_to_multiple_of: int = 1

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        longest = max(len(f["input_ids"]) for f in features)
        m = max(1, self.pad_to_multiple_of)
        width = -(-longest // m) * m
        ids, labels, pos = [], [], []
        real = 0
        for f in features:
            n = len(f["input_ids"])
            pad = width - n
            real += n
            ids.append(f["input_ids"] + [self.pad_token_id] * pad)
            labels.append(f["labels"] + [IGNORE_INDEX] * pad)
            last = f["position_ids"][-1] + 1 if f["position_ids"] else 0
            pos.append(f["position_ids"] + list(range(last, last + pad)))
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(pos, dtype=torch.long),
            "num_real_tokens": torch.tensor(real, dtype=torch.long),
            "num_padded_tokens": torch.tensor(width * len(features), dtype=torch.long),
        }
