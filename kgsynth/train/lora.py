"""LoRA adapters through PEFT for SFT and GRPO (``--lora-r R``; 0 trains every weight).

A LoRA run's folder holds the adapter (``adapter_config.json``, ``adapter_model.safetensors``)
and the tokenizer; its ``adapter_config.json`` names the base model folder, so transformers
(with peft installed) loads it like a full checkpoint, and the next stage, ``eval`` and RL can
start from it. ``kgsynth train merge RUN --out DIR`` folds the adapter into the base weights
and writes a plain ``save_pretrained`` folder that vLLM can serve. In GRPO the KL reference is
the policy with its adapter switched off (``disable_adapter()``), not a second model copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.core.modelio import ADAPTER_CONFIG, is_adapter


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
    """``model`` with fresh LoRA adapters on ``target`` (only they train)."""
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
        return get_peft_model(model, config)
    except ValueError as exc:  # a target module the model does not have
        raise ConfigError(f"--lora-target {target!r}: {exc}") from None


def merge(run: str | Path, out: str | Path) -> dict[str, Any]:
    """Fold a LoRA run's adapter into its base model; write a full HF folder to ``out``."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    from kgsynth.agent.carried import AGENT_CONFIG_FILE
    from kgsynth.agent.prompt import SYSTEM_PROMPT_FILE

    run, out = Path(run), Path(out)
    if not is_adapter(run):
        raise ConfigError(f"{run} holds no LoRA adapter ({ADAPTER_CONFIG}); nothing to merge")
    model = AutoPeftModelForCausalLM.from_pretrained(run, dtype=torch.float32)
    merged = model.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(run).save_pretrained(out)
    for name in (SYSTEM_PROMPT_FILE, AGENT_CONFIG_FILE):  # the merged model carries its agent
        if (run / name).is_file():
            (out / name).write_text((run / name).read_text(encoding="utf-8"), encoding="utf-8")
    return {"parameters": sum(p.numel() for p in merged.parameters()), "out": str(out)}
