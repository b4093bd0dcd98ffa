"""Checkpoints and the models they started from: the label of a checkpoint in tables and
plots, and the untrained model the ``untrained`` baseline evaluates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.core.modelio import is_model_folder


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_label(model: str) -> str:
    """A short name for a model: the training stage of a kgsynth checkpoint (``stage1``,
    ``stage2``, ``rl``), else the folder or model name."""
    path = Path(model)
    manifest = _manifest(path) if path.is_dir() else None
    stage = str((manifest or {}).get("stage", ""))
    if stage.startswith("train "):
        return stage.removeprefix("train ").strip()
    return path.name or model


def _weights_sha256(folder: Path) -> str | None:
    from kgsynth.core.manifest import sha256_file

    weights = folder / "model.safetensors"
    return sha256_file(weights) if weights.is_file() else None


def untrained_model(checkpoint: str | Path) -> Path:
    """The model a kgsynth checkpoint was first trained from: ``manifest.json``'s
    ``start_from.path``, followed back until a folder that was not trained by kgsynth (a tiny
    run's ``init-tiny``, or the base model). A relative path is tried from here, then inside
    and beside the folder that names it (a moved run folder); where the manifest recorded the
    starting weights' SHA-256, the folder must hold those weights."""
    ckpt = Path(checkpoint)
    current, seen = ckpt, {ckpt.resolve()}
    while True:
        manifest = _manifest(current)
        start_from = (manifest or {}).get("start_from") or {}
        start = start_from.get("path")
        if not start:
            break
        named = Path(start)
        candidates = list(
            dict.fromkeys(
                c
                for c in (named, current / named.name, current.parent / named.name)
                if is_model_folder(c)
            )
        )
        if not candidates:
            raise ConfigError(
                f"--baseline untrained: {current / 'manifest.json'} says the model started from "
                f"{start}, which is not a checkpoint folder here; pass --baseline-model PATH"
            )
        sha = start_from.get("weights_sha256")
        if sha:
            matching = [c for c in candidates if _weights_sha256(c) == sha]
            if not matching:
                raise ConfigError(
                    f"--baseline untrained: {candidates[0]} does not hold the weights "
                    f"{current / 'manifest.json'} records as the start (sha256 {sha[:12]}…); "
                    "pass --baseline-model PATH"
                )
            candidates = matching
        found = candidates[0]
        if found.resolve() in seen:
            raise ConfigError(
                f"--baseline untrained: the start_from chain of {ckpt} loops at {found}; "
                "pass --baseline-model PATH"
            )
        seen.add(found.resolve())
        current = found
    if current == ckpt:
        raise ConfigError(
            f"--baseline untrained: {ckpt} has no manifest.json with start_from (not a run of "
            "`kgsynth train`); pass --baseline-model PATH"
        )
    return current


def eval_carries(given: dict[str, Any], params: dict[str, Any]) -> Any:
    """The agent settings a local checkpoint (``--llm hf --model DIR``) was trained with, which
    eval starts from (``config_command(carried=...)``); a tool set other than its own, from
    ``--toolset`` or the ``--config`` file, only with ``--allow-toolset-change``. An API model
    (``--llm openai``) or a folder without them carries none."""
    from kgsynth.agent.carried import check_toolset_change, model_agent

    if params.get("llm") != "hf" or not params.get("model"):
        return None
    agent = model_agent(params["model"])
    check_toolset_change(agent, given, "--toolset (or --config) sets")
    return agent
