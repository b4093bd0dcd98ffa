"""LoRA adapters through PEFT for SFT and GRPO (``--lora-r R``; 0 trains every weight).

A LoRA run's folder holds the adapter (``adapter_config.json``, ``adapter_model.safetensors``)
and the tokenizer; its ``adapter_config.json`` names the base model folder by absolute path and
``adapter_base.json`` names it relative to the run folder (:mod:`kgsynth.core.modelio`), so
the next stage, ``eval`` and RL start from it from any working directory, and a run folder
moved together with its base still loads. ``kgsynth train merge RUN --out DIR`` folds the
adapter into the base weights and writes a plain ``save_pretrained`` folder that vLLM can
serve; ``--base-model PATH`` names a base that is no longer where the adapter says. In GRPO the KL reference is
the policy with its adapter switched off (``disable_adapter()``), not a second model copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.core.modelio import ADAPTER_CONFIG, is_adapter, is_model_folder


def check_lora(r: int, alpha: float, dropout: float, target: str) -> None:
    if r < 0:
        raise ConfigError(f"lora_r must be >= 0 (0: no LoRA; got {r})")
    if r == 0:
        return
    if alpha <= 0:
        raise ConfigError(f"lora_alpha must be > 0 (got {alpha})")
    if not 0 <= dropout < 1:
        raise ConfigError(f"lora_dropout must be in [0, 1) (got {dropout})")
    if not target.strip():
        raise ConfigError("lora_target must name modules (comma-separated) or all-linear")
    try:
        import peft  # noqa: F401
    except ImportError:
        raise ConfigError("--lora-r needs the peft package: pip install peft") from None


def wrap(model: Any, r: int, alpha: float, dropout: float, target: str) -> Any:
    """``model`` with fresh LoRA adapters on ``target`` (only they train). Its adapter names
    the folder ``model`` was loaded from by absolute path, so every checkpoint and the saved
    adapter load from any working directory."""
    from peft import LoraConfig, get_peft_model

    names = target.strip()
    modules: str | list[str] = (
        "all-linear"
        if names == "all-linear"
        else [m.strip() for m in names.split(",") if m.strip()]
    )
    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=modules, task_type="CAUSAL_LM"
    )
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:  # a target module the model does not have
        raise ConfigError(f"--lora-target {target!r}: {exc}") from None
    named = str(getattr(model, "name_or_path", "") or "")
    if named and is_model_folder(named):  # as given on the command line: maybe relative
        wrapped.peft_config["default"].base_model_name_or_path = str(Path(named).resolve())
    return wrapped


def merge(run: str | Path, out: str | Path, base_model: str | Path | None = None) -> dict[str, Any]:
    """Fold a LoRA run's adapter into its base model (where the adapter says, or
    ``base_model``); write a full HF folder to ``out``."""
    import torch
    from transformers import AutoTokenizer

    from kgsynth.agent.carried import AGENT_CONFIG_FILE
    from kgsynth.agent.prompt import SYSTEM_PROMPT_FILE
    from kgsynth.core.modelio import load_causal_lm

    run, out = Path(run), Path(out)
    if not is_adapter(run):
        raise ConfigError(f"{run} holds no LoRA adapter ({ADAPTER_CONFIG}); nothing to merge")
    merged = load_causal_lm(run, base_model=base_model, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(run).save_pretrained(out)
    for name in (SYSTEM_PROMPT_FILE, AGENT_CONFIG_FILE):  # the merged model carries its agent
        if (run / name).is_file():
            (out / name).write_text((run / name).read_text(encoding="utf-8"), encoding="utf-8")
    return {"parameters": sum(p.numel() for p in merged.parameters()), "out": str(out)}
