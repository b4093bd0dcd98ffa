"""What SFT (:mod:`kgsynth.train.sft`) and GRPO (:mod:`kgsynth.train.grpo`) share.

- recipes: a config's ``None`` fields filled from a named recipe, and the recipe an earlier run
  folder recorded;
- field checks: :func:`need` and the checks both configs make (tracking, LoRA);
- precision: bf16 on a CUDA GPU with bf16, fp32 on CPU (:func:`resolve_precision`);
- DeepSpeed: reading a ZeRO config (:func:`load_deepspeed_config`), the environment a
  one-process DeepSpeed run needs (:func:`single_process_env`) and its CPU communication
  backend (:func:`use_gloo_on_cpu`);
- the agent's system prompt and settings stored beside every saved checkpoint;
- the process group of a launched run: this process's rank and the world size
  (:func:`rank_and_world`) and element-wise sums over the ranks (:func:`all_sum`), used by
  GRPO's steps and SFT's copy warm-up.

Importing this module loads no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.config import option_value
from kgsynth.core.errors import ConfigError

PRECISIONS = ("auto", "bf16", "fp32")
# the resolved configuration a training run folder holds (SFT's; GRPO's is rl_config.json)
SFT_SPEC = "train_config.json"


def need(ok: bool, message: str) -> None:
    """A field check: ``message`` (naming the field and its valid range) when not ``ok``."""
    if not ok:
        raise ConfigError(message)


def fill_recipe(cfg: Any, recipes: Mapping[str, Mapping[str, Any]], recipe: str) -> dict[str, Any]:
    """The recipe's value for each of its fields the config leaves ``None``, the config's own
    for the rest; ``recipe`` must be one of ``recipes``."""
    if recipe not in recipes:
        raise ConfigError(f"recipe must be one of {', '.join(recipes)} (got {recipe!r})")
    return {
        k: (v if option_value(cfg, k) is None else option_value(cfg, k))
        for k, v in recipes[recipe].items()
    }


def recorded_recipe(folder: str | Path, names: Sequence[str] = (SFT_SPEC,)) -> str | None:
    """The recipe the first readable run file of ``names`` in ``folder`` records, if any."""
    for name in names:
        try:
            return json.loads((Path(folder) / name).read_text())["config"]["recipe"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def check_tracking_and_lora(cfg: Any) -> None:
    """The checks of the ``report_to`` and ``lora_*`` fields both configs have."""
    from kgsynth.core.tracking import check_report_to
    from kgsynth.train.lora import check_lora

    check_report_to(cfg.report_to)
    check_lora(cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target)


def check_selection(cfg: Any) -> None:
    """The checks of the early-stopping values (``select_limit``, ``select_alpha``) both
    configs have."""
    need(cfg.select_limit >= 1, f"select_limit must be >= 1 (got {cfg.select_limit})")
    need(0 < cfg.select_alpha <= 1, f"select_alpha must be in (0, 1] (got {cfg.select_alpha})")


def check_selection_inputs(cfg: Any) -> None:
    """With ``select_questions``: the file exists and the run saves whole weights (a LoRA run
    saves adapters, which early stopping cannot swap); checked when the config is resolved."""
    from kgsynth.core.errors import InputFileError

    if cfg.select_questions is None:
        return
    if not Path(cfg.select_questions).is_file():
        raise InputFileError(Path(cfg.select_questions), "does not exist (--select-questions)")
    if cfg.lora_r:
        raise ConfigError(
            "--select-questions keeps whole weights; a LoRA run (--lora-r) saves adapters"
        )


def resolve_precision(precision: str) -> tuple[bool, bool]:
    """(use_cpu, bf16) for this machine and a ``precision`` option (auto, bf16, fp32); shared
    by SFT and GRPO."""
    import torch

    cuda = torch.cuda.is_available()
    bf16_ok = cuda and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not bf16_ok:
        raise ConfigError("precision bf16 needs a CUDA GPU with bf16; use fp32 (or auto) on CPU")
    return (not cuda), (precision == "bf16" or (precision == "auto" and bf16_ok))


def load_deepspeed_config(path: str | Path) -> dict[str, Any]:
    """A ZeRO config as a dict: a JSON file, or a packaged config by name (``zero2``; see
    :func:`kgsynth.resources.find_deepspeed`); errors name the file."""
    from kgsynth.resources import find_deepspeed

    path = find_deepspeed(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--deepspeed: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"--deepspeed: {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "zero_optimization" not in data:
        raise ConfigError(f"--deepspeed: {path} must be a DeepSpeed config with zero_optimization")
    return data


def use_gloo_on_cpu() -> None:
    """DeepSpeed's CPU backend otherwise probes its ops with test compiles and JIT-builds its
    shared-memory all-reduce (a C++ compile, ~1 min, needs a compiler) on first use; gloo does
    the same job. The table is the one DeepSpeed reads (deepspeed/comm/torch.py)."""
    import deepspeed.ops

    deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def single_process_env() -> Iterator[bool]:
    """``MASTER_ADDR/PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` for a one-process
    DeepSpeed run (without them DeepSpeed looks for MPI). Variables already set, as a launcher
    sets them, are left alone. Yields whether it set them; restores the environment after."""
    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    # accelerate leaves these behind, and a later run in this process would take them up
    left_behind = ("LOCAL_WORLD_SIZE", "ACCELERATE_USE_DEEPSPEED")
    if "WORLD_SIZE" in os.environ:
        yield False
        return
    keys += left_behind
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    try:
        yield True
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def deepspeed_env(deepspeed: str | None) -> contextlib.AbstractContextManager[bool]:
    """:func:`single_process_env` for a DeepSpeed run, nothing for a plain one."""
    return single_process_env() if deepspeed is not None else contextlib.nullcontext(False)


def store_system_prompt(
    folder: Path, system_text: str | None, agent: Any = None, agent_file: Path | None = None
) -> None:
    """Eval, RL and rollouts of a checkpoint prompt it the way it was trained, in the tool
    environment it was trained in: the system prompt, and the agent settings (``agent``, an
    AgentConfig, or the run's ``agent_file`` copied) as ``agent_config.json``
    (:mod:`kgsynth.agent.carried`)."""
    import shutil

    from kgsynth.agent.carried import AGENT_CONFIG_FILE, write_agent_file
    from kgsynth.agent.loop import SYSTEM_PROMPT_FILE

    if system_text is not None:
        (folder / SYSTEM_PROMPT_FILE).write_text(system_text, encoding="utf-8")
    if agent is not None:
        write_agent_file(folder, agent)
    elif agent_file is not None and agent_file.is_file():
        tmp = folder / f".{AGENT_CONFIG_FILE}.tmp"
        shutil.copyfile(agent_file, tmp)
        os.replace(tmp, folder / AGENT_CONFIG_FILE)


def write_json_atomic(path: Path, data: Any) -> None:
    """``path`` written whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# Help of the flags both SFT and GRPO have, written once.
HELP = {
    "seed": "Seed.",
    "deepspeed": "DeepSpeed ZeRO config: a packaged one by name (zero0, zero2, zero3; "
    "`kgsynth recipes zero2` prints it) or a JSON file.",
    "precision": "auto (bf16 on a CUDA GPU, fp32 on CPU), bf16 or fp32.",
    "report_to": "Mirror the metrics to tensorboard (RUN/tensorboard; `tensorboard --logdir RUN`) "
    "or wandb (needs `pip install wandb`), or none.",
    "lora_r": "Train LoRA adapters of this rank (PEFT) instead of every weight; the run folder "
    "keeps the adapter (`kgsynth train merge` writes full weights). 0: no LoRA.",
    "lora_alpha": "LoRA scaling alpha.",
    "lora_dropout": "LoRA dropout.",
    "lora_target": "Modules that get adapters: comma-separated names (q_proj,v_proj) or "
    "all-linear.",
    "max_grad_norm": "Gradient clipping: the largest gradient norm.",
    "weight_decay": "AdamW weight decay.",
    "select_questions": "Early stopping: validation questions (a file as `kgsynth eval "
    "--questions`; none the run trains on). After training, the starting model (stage2: stage "
    "1's; stage1 has none), each checkpoint and the last weights answer them greedily and the "
    "run keeps the weights with the best Hits@1 (a tie: the later) if they beat the starting "
    "ones (stage1: the last ones) beyond chance (--select-alpha), else those; selection.json "
    "lists every score. "
    "\\[default: keep the last weights]",
    "select_limit": "--select-questions: how many of them (the first N).",
    "select_cache": "--select-questions: a request cache (SQLite) the validation answers go "
    "through. A model is known there by its files, so one scored before on the same questions "
    "(stage 2's or GRPO's start, where an earlier stage kept its weights) answers from it. "
    "\\[default: none]",
    "select_alpha": "--select-questions: the best checkpoint replaces the starting weights only "
    "if an exact sign test on the validation questions the two answer differently gives p "
    "below this (1: always the best).",
}


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the running process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_sum(values: Sequence[float], device: str = "cpu") -> list[float]:
    """Element-wise sum over the ranks (the values themselves in one process)."""
    import torch
    import torch.distributed as dist

    if rank_and_world()[1] == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return [float(v) for v in t.tolist()]
