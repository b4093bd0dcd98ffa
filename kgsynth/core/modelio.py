"""Model folders: a full ``save_pretrained`` checkpoint, or a LoRA run's adapter folder
(``adapter_config.json``, which names its base model). Every stage that starts from a model
(SFT, RL, eval, free rollouts) loads it through :func:`load_causal_lm`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
# what the training stages write beside a model: records of the run, not part of what it
# generates (checkpoint folders are left out too)
RUN_RECORDS = frozenset(
    {
        "manifest.json",
        "train_summary.json",
        "train_config.json",
        "trainer_state.json",
        "training_args.bin",
        "rl_summary.json",
        "rl_config.json",
        "rl_spec.json",
        "selection.json",
        "resume_state.pt",
        # the agent's settings decide the prompts, which the request cache keys hold; a stage
        # that kept its start's weights under other settings still answers from the cache
        "agent_config.json",
    }
)
RECORD_SUFFIXES = (".png", ".jsonl", ".md", ".log", ".html")


def is_adapter(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def is_model_folder(folder: str | Path) -> bool:
    """A folder a causal LM loads from: a full checkpoint or a LoRA run's adapter."""
    return (Path(folder) / "config.json").is_file() or is_adapter(folder)


def load_causal_lm(path: str | Path, **kwargs: Any) -> Any:
    """A causal LM from a full checkpoint folder, or from a LoRA run's folder with its adapter
    merged into the base weights (so every stage can start from either)."""
    from transformers import AutoModelForCausalLM

    if is_adapter(path):
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(path, **kwargs).merge_and_unload()
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def model_digest(folder: str | Path) -> str:
    """sha256 over the files of a model folder that decide what it generates: weights, config,
    generation config, tokenizer, chat template and stored system prompt (a LoRA folder adds
    its local base model's). Two folders holding the same model have the same digest whatever
    run wrote them (a stage that kept its starting weights); retrained weights change it."""
    from kgsynth.core.manifest import sha256_file

    root = Path(folder)
    h = hashlib.sha256()
    for f in sorted(p for p in root.iterdir() if p.is_file()):
        if f.name in RUN_RECORDS or f.suffix in RECORD_SUFFIXES or f.name.startswith("."):
            continue
        h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    if is_adapter(root):
        base = json.loads((root / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        if base and Path(base).is_dir():
            h.update(f"base\0{model_digest(base)}\n".encode())
    return h.hexdigest()
