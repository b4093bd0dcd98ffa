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
  the papers), every row is one sample, and batches group samples of similar length.
- The order rows are trained in (:class:`RowOrder`) is a function of the seed and the epoch
  alone, never of a random state left over from earlier epochs, so a run resumed from a
  checkpoint inside an epoch trains on that epoch's remaining batches in the order the
  uninterrupted run did.
- Batches are right-padded to their longest row (to a multiple of ``pad_to_multiple_of``);
  padding is causal-invisible to real tokens (it comes after them; its positions continue the
  row's last sample) and is ``-100`` in ``labels``. Every batch carries its real and padded token
  counts, so the metrics report the non-padding fraction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgsynth.core.errors import InputFileError

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


def read_corpus(path: str | Path) -> list[list[dict[str, Any]]]:
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
    out: list[list[dict[str, Any]]] = []
    for i, messages in enumerate(table.column("messages").to_pylist()):
        if not messages:
            raise InputFileError(path, f"row {i}: 'messages' is empty")
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or m.get("content") is None:
                raise InputFileError(
                    path,
                    f"row {i}, message {j}: needs role in {sorted(ROLES)} and a content string",
                )
        out.append([_message(m) for m in messages])
    if not out:
        raise InputFileError(path, "has no rows")
    return out


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A corpus message as the renderer takes it: role and content, and ``"train": False``
    where the row marks an assistant turn as context only (a recovery's wrong step)."""
    out = {"role": m["role"], "content": m["content"]}
    if m.get("train") is False:
        out["train"] = False
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


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's row order: a hash of both, so neighbouring seeds do not share
    orders shifted by an epoch (as ``seed + epoch`` would)."""
    import hashlib

    digest = hashlib.sha256(f"sft-row-order|{seed}|{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class RowOrder:
    """The training sampler: a shuffle of the rows, a fresh one every epoch, and with
    ``group_size`` grouped by length (transformers' length grouping: shuffled, cut into
    megabatches, each sorted longest first) so a batch pads little.

    Why not transformers' own samplers: its ``LengthGroupedSampler`` shuffles with the global
    torch generator, whose state at the start of epoch ``e`` is whatever the epochs before left
    there; a run resumed inside epoch ``e`` starts with a fresh state, draws another order and
    skips the wrong batches (its final weights differed from an uninterrupted run's, issue 41).
    The random sampler accelerate seeds per epoch learns its epoch through ``set_epoch``, which
    a multi-process dataloader that skips the resumed epoch's first batches does not pass on.
    Here each epoch's order is drawn from :func:`epoch_seed` alone; the epoch comes through
    ``set_epoch`` (from the trainer's dataloader and from its epoch-begin callback)."""

    def __init__(self, lengths: Sequence[int], seed: int, group_size: int | None) -> None:
        self.lengths = list(lengths)
        self.seed = seed
        self.group_size = group_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.lengths)

    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s row indices, in training order."""
        import torch

        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        if self.group_size:
            from transformers.trainer_pt_utils import get_length_grouped_indices

            return list(
                get_length_grouped_indices(self.lengths, self.group_size, generator=generator)
            )
        return torch.randperm(len(self.lengths), generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch))


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
