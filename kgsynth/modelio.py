"""Model folders: a full ``save_pretrained`` checkpoint, or a LoRA run's adapter folder
(``adapter_config.json``, which names its base model). Every stage that starts from a model
(SFT, RL, eval, free rollouts) loads it through :func:`load_causal_lm`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"


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
