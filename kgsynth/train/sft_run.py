"""An SFT run folder: its resolved spec (``OUT/train_config.json``), its preparation (resume,
refuse or start afresh; the tiny model built), its checkpoints and its ``metrics.jsonl``.

:func:`prepare_run` runs once, before any training process starts; every launched worker
then reads the same :class:`RunSpec`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.core.config import config_from_record, config_record
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.train.sft_config import (
    RESUMABLE_CHANGES,
    SPEC,
    TINY_INIT,
    SFTConfig,
    resolve_config,
)


@dataclass(frozen=True)
class RunSpec:
    """Everything a training process needs; written to ``OUT/train_config.json`` so launched
    workers (and a resumed run) read the same resolved configuration."""

    stage: str
    corpus: str
    out: str
    config: SFTConfig

    @property
    def model_path(self) -> Path:
        c = self.config
        if self.stage == "stage2":
            return Path(c.init or "")
        return Path(self.out) / TINY_INIT if c.model == "tiny" else Path(c.model or "")

    def to_json(self) -> str:
        return json.dumps(
            {
                "stage": self.stage,
                "corpus": self.corpus,
                "out": self.out,
                "config": config_record(self.config),
            },
            indent=2,
        )

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        data = json.loads(Path(path).read_text())
        return cls(
            data["stage"],
            data["corpus"],
            data["out"],
            config_from_record(SFTConfig, data["config"]),
        )


def prepare_run(
    cfg: SFTConfig, stage: str, corpus: str | Path, out: str | Path, *, overwrite: bool = False
) -> RunSpec:
    """Resolve the config, validate the corpus, set up ``out`` and build the tiny model.

    A folder holding an earlier run of the same configuration is resumed from its last
    checkpoint; a finished run (one with its ``manifest.json``, written last) or a different
    configuration there is an error unless ``overwrite`` (which deletes the earlier run). Runs once, before any training process starts."""
    from kgsynth.train.data import corpus_texts, read_corpus

    cfg = resolve_config(cfg, stage)
    out = Path(out)
    spec = RunSpec(stage, str(Path(corpus)), str(out), cfg)
    conversations = read_corpus(corpus)
    old = out / SPEC
    if out.exists() and {p.name for p in out.iterdir()} <= {TINY_INIT, SPEC + ".tmp"}:
        # the leftovers of a run stopped while it was being prepared: start it afresh
        shutil.rmtree(out)
    if out.exists() and any(out.iterdir()):
        if not old.is_file():
            raise ConfigError(
                f"--out: {out} is not empty and holds no kgsynth training run; choose a new folder"
            )
        if overwrite:
            shutil.rmtree(out)
        elif (out / "manifest.json").is_file():
            raise ConfigError(
                f"--out: {out} holds a finished run (its manifest.json); pass --overwrite to "
                "train it again, or choose a new --out"
            )
        else:
            try:
                before = RunSpec.read(old)
            except (ValueError, KeyError, TypeError) as exc:
                raise InputFileError(old, f"unreadable ({exc}); use --overwrite") from None
            changed = _changed_fields(before, spec)
            if changed:
                raise ConfigError(
                    f"--out: {out} holds a run with different {', '.join(changed)}; "
                    "use --overwrite to start over, or a new --out"
                )
    out.mkdir(parents=True, exist_ok=True)
    if stage == "stage1" and cfg.model == "tiny" and not (out / TINY_INIT / "config.json").exists():
        from kgsynth.train.tiny import build_tiny_model

        build_tiny_model(
            corpus_texts(conversations),
            out / TINY_INIT,
            vocab_size=cfg.tiny_vocab_size,
            hidden_size=cfg.tiny_hidden_size,
            num_layers=cfg.tiny_layers,
            num_heads=cfg.tiny_heads,
            num_kv_heads=cfg.tiny_kv_heads,
            init_std=cfg.tiny_init_std,
            max_position=max(2048, cfg.max_length or 0),
            seed=cfg.seed,
        )
    tmp = old.with_name(old.name + ".tmp")
    tmp.write_text(spec.to_json() + "\n")
    os.replace(tmp, old)
    return spec


def _changed_fields(before: RunSpec, now: RunSpec) -> list[str]:
    changed = [k for k in ("stage", "corpus") if getattr(before, k) != getattr(now, k)]
    a, b = config_record(before.config), config_record(now.config)
    changed += [k for k in a if a[k] != b.get(k) and k not in RESUMABLE_CHANGES]
    return changed


def last_complete_checkpoint(ckpt_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` that was saved whole, or None.

    The Trainer writes a checkpoint in place: kgsynth's run state, weights, then optimizer,
    scheduler and RNG states, then ``trainer_state.json``. A run killed while saving leaves a
    folder without the last of these, and resuming from it would silently start with a fresh
    optimizer, so such folders are passed over (the resumed run saves them again when it gets
    there). ``trainer_state.json`` itself is written in place, not renamed into it: a kill
    between its creation and its one write leaves it empty, and resuming from that folder
    would fail to parse it, so it must parse too."""
    if not ckpt_dir.is_dir():
        return None
    steps = []
    for folder in ckpt_dir.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", folder.name)
        if m and folder.is_dir() and _whole_json(folder / "trainer_state.json"):
            steps.append((int(m.group(1)), folder))
    return str(max(steps)[1]) if steps else None


def _whole_json(path: Path) -> bool:
    """Whether ``path`` is a file holding a JSON object (not one a kill cut short)."""
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def keep_metrics_upto(path: Path, step: int) -> None:
    """Drop metric lines a killed run logged after the checkpoint it resumes from."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if json.loads(ln).get("step", 0) <= step]
    if len(kept) != len(lines):
        path.write_text("".join(ln + "\n" for ln in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
