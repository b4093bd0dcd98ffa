"""Model folders: a full ``save_pretrained`` checkpoint, or a LoRA run's adapter folder
(``adapter_config.json``, which names its base model). Every stage that starts from a model
(SFT, RL, eval, free rollouts) loads it through :func:`load_causal_lm`.

An adapter kgsynth saves names its base by absolute path in ``adapter_config.json`` and, in
``adapter_base.json`` (:func:`record_adapter_base`), by its path relative to the adapter folder,
so a run folder moved together with its base still loads. :func:`adapter_base` finds the base:
relative to the adapter first, then the absolute path, then the name as written (a folder
relative to here, or a hub id). A base that is not on this machine fails at once, naming the
adapter, the base it wants and ``--base-model``, instead of trying the hub for a folder name.
How many positions a model attends over (:func:`position_limit`) bounds the token caps the
stages set (:func:`fit_to_model`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from kgsynth.core.errors import InputFileError

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_BASE = "adapter_base.json"
BASE_FLAG = "--base-model PATH"
BASE_FIX = f"pass {BASE_FLAG} (the model folder the adapter was trained from)"
# what a training stage, which has no --base-model, says instead
MERGE_FIX = (
    f"merge it with `kgsynth train merge RUN --out DIR {BASE_FLAG}` and start from DIR, or put "
    "the base back"
)
# the records kgsynth writes into a training run's folder: an adapter with one of them was
# trained by kgsynth, which starts only from local folders, so its base is never a hub id
_KGSYNTH_RUN_FILES = ("train_config.json", "rl_config.json", "manifest.json", ADAPTER_BASE)
# transformers' stand-in for "no limit" is 1e30; any real model's is far below this
_SANE_MAX_LENGTH = 10_000_000
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
        # where the base model is: it decides nothing the model generates (the base's own
        # files are hashed into the digest)
        ADAPTER_BASE,
    }
)
RECORD_SUFFIXES = (".png", ".jsonl", ".md", ".log", ".html")


def is_adapter(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def is_model_folder(folder: str | Path) -> bool:
    """A folder a causal LM loads from: a full checkpoint or a LoRA run's adapter."""
    return (Path(folder) / "config.json").is_file() or is_adapter(folder)


def load_causal_lm(path: str | Path, *, base_model: str | Path | None = None, **kwargs: Any) -> Any:
    """A causal LM from a full checkpoint folder, or from a LoRA run's folder with its adapter
    merged into the base weights (so every stage can start from either). An adapter's base is
    found by :func:`adapter_base` (``base_model`` overrides it); a base that is itself an
    adapter folder is merged first."""
    from transformers import AutoModelForCausalLM

    if not is_adapter(path):
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    from peft import PeftModel

    base = adapter_base(path, base_model)
    model = load_causal_lm(base, **kwargs)
    merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    # a LoRA wrapped around this model next (stage 2, RL) names this folder as its base
    merged.name_or_path = merged.config._name_or_path = str(Path(path).resolve())
    return merged


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputFileError(path, f"unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise InputFileError(path, "holds no JSON object")
    return data


def _offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _looks_local(name: str) -> bool:
    """A name only a path has: absolute, ``./``, ``../``, ``~``, a backslash, or more than the
    one slash of a hub id (``org/model``)."""
    return (
        Path(name).is_absolute()
        or name.startswith((".", "~"))
        or "\\" in name
        or name.count("/") > 1
    )


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # a name the hub client rejects is no cached model
        return False


def adapter_base(
    adapter: str | Path, override: str | Path | None = None, fix: str = BASE_FIX
) -> str:
    """The base model of the LoRA adapter folder ``adapter``: ``override`` (``--base-model``)
    when given; else the folder ``adapter_base.json`` names relative to the adapter, its
    absolute path, then ``base_model_name_or_path`` as written (a folder relative to here, then
    to the adapter; else a hub id). A base that should be a local folder and is not there, or
    a hub id not in the local cache while ``HF_HUB_OFFLINE`` is set, is an
    :class:`InputFileError` naming the adapter, the base and ``fix`` (what the command takes:
    ``--base-model``); nothing is tried on the network for it."""
    folder = Path(adapter)
    config_path = folder / ADAPTER_CONFIG
    if override is not None:
        if is_model_folder(override):
            return str(Path(override).resolve())
        raise InputFileError(
            config_path, f"--base-model {override} is not a model folder (no config.json)"
        )
    name = str(_read_json(config_path).get("base_model_name_or_path") or "")
    record = _read_json(folder / ADAPTER_BASE) if (folder / ADAPTER_BASE).is_file() else {}
    candidates = []
    if isinstance(record.get("relative"), str):
        candidates.append(folder / record["relative"])
    if isinstance(record.get("absolute"), str):
        candidates.append(Path(record["absolute"]))
    if name:
        candidates += [Path(name).expanduser(), folder / name]
    for candidate in candidates:
        if is_model_folder(candidate):
            return str(candidate.resolve())
    wanted = record.get("absolute") or name
    if not wanted:
        raise InputFileError(config_path, f"names no base model; {fix}")
    trained_here = any((folder / f).is_file() for f in _KGSYNTH_RUN_FILES)
    if trained_here or _looks_local(str(wanted)):
        beside = f" nor at {record['relative']} from the adapter" if "relative" in record else ""
        raise InputFileError(
            config_path,
            f"the LoRA adapter's base model is not at {wanted}{beside}; {fix}",
        )
    if _offline() and not _in_hub_cache(str(wanted)):
        raise InputFileError(
            config_path,
            f"the LoRA adapter's base model {wanted} is no local folder and not in the hub "
            f"cache, and HF_HUB_OFFLINE is set; {fix}",
        )
    return str(wanted)


def record_adapter_base(adapter: str | Path, base: str | Path | None = None) -> None:
    """For a LoRA adapter folder kgsynth saved, name its base model (``base``, default the one
    ``adapter_config.json`` names) by absolute path in ``adapter_config.json`` and relative to
    the adapter in ``adapter_base.json``. A base that is no local folder (a hub id) is left as
    it is. Nothing happens for a folder without an adapter."""
    folder = Path(adapter)
    if not is_adapter(folder):
        return
    config_path = folder / ADAPTER_CONFIG
    config = _read_json(config_path)
    named = Path(str(base or config.get("base_model_name_or_path") or ""))
    if not str(named) or not is_model_folder(named):
        return
    absolute = named.resolve()
    config["base_model_name_or_path"] = str(absolute)
    record = {
        "format": 1,
        "relative": os.path.relpath(absolute, folder.resolve()),
        "absolute": str(absolute),
    }
    for path, data in ((config_path, config), (folder / ADAPTER_BASE, record)):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)


def position_limit(folder: str | Path) -> tuple[int, str] | None:
    """The most token positions the model in ``folder`` attends over and where that is said
    (``config.json``'s ``max_position_embeddings``, else the tokenizer's ``model_max_length``
    when it is a real limit); an adapter's are its base's. None where nothing says."""
    root = Path(folder)
    if is_adapter(root):
        try:
            root = Path(adapter_base(root))
        except InputFileError:
            return None  # loading the model names the missing base
    for source, keys in (("config.json", ("max_position_embeddings", "n_positions")),
                         ("tokenizer_config.json", ("model_max_length",))):  # fmt: skip
        path = root / source
        if not path.is_file():
            continue
        data = _read_json(path)
        sections = [
            data,
            data.get("text_config") if isinstance(data.get("text_config"), dict) else {},
        ]
        for section in sections:
            for key in keys:
                value = section.get(key)
                if (
                    isinstance(value, int)
                    and not isinstance(value, bool)
                    and 0 < value < _SANE_MAX_LENGTH
                ):
                    return value, f"{key} in {path}"
    return None


def fit_to_model(setting: str, value: int | None, folder: str | Path | None) -> int | None:
    """``value`` of the token cap ``setting``, at most the positions of the model in
    ``folder`` (:func:`position_limit`); a value above them is lowered to them with one
    warning naming the setting, the value asked and the model's limit."""
    if value is None or folder is None or not is_model_folder(folder):
        return value
    limit = position_limit(folder)
    if limit is None or value <= limit[0]:
        return value
    log.warning(
        "%s %d is more than the model's %d positions (%s); using %s %d",
        setting, value, limit[0], limit[1], setting, limit[0],
    )  # fmt: skip
    return limit[0]


def model_digest(folder: str | Path) -> str:
    """sha256 over the files of a model folder that decide what it generates: weights, config,
    generation config, tokenizer, chat template and stored system prompt (a LoRA folder adds
    its local base model's, wherever that lies). Two folders holding the same model have the same digest whatever
    run wrote them (a stage that kept its starting weights); retrained weights change it."""
    from kgsynth.core.manifest import sha256_file

    root = Path(folder)
    h = hashlib.sha256()
    for f in sorted(p for p in root.iterdir() if p.is_file()):
        if f.name in RUN_RECORDS or f.suffix in RECORD_SUFFIXES or f.name.startswith("."):
            continue
        if f.name == ADAPTER_CONFIG:  # where the base lies is no part of the model
            config = {k: v for k, v in _read_json(f).items() if k != "base_model_name_or_path"}
            digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
        else:
            digest = sha256_file(f)
        h.update(f"{f.name}\0{digest}\n".encode())
    if is_adapter(root):
        try:
            base = adapter_base(root)
        except InputFileError:  # loading it names the missing base
            base = None
        if base and Path(base).is_dir():
            h.update(f"base\0{model_digest(base)}\n".encode())
    return h.hexdigest()
