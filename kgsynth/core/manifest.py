"""``manifest.json``: what every stage writes next to its output."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import kgsynth
from kgsynth import __version__
from kgsynth.core.text import redact_argv, redact_text

_PACKAGES = (
    "pyoxigraph",
    "polars",
    "pyarrow",
    "torch",
    "transformers",
    "deepspeed",
    "peft",
    "openai",
)


def git_sha() -> str | None:
    """The commit of the kgsynth checkout this code runs from (with ``-dirty`` when it has
    changes); None for an installed kgsynth (a wheel in site-packages), even one whose
    environment lies inside some other git repository, and where git is missing."""
    root = Path(kgsynth.__file__).resolve().parent.parent  # a checkout: the folder of .git
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) if sha else None


def versions() -> dict[str, str]:
    out = {"kgsynth": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _redacted(value: Any) -> Any:
    """``value`` with secrets redacted in every string inside it (dict keys are names and
    stay as they are)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def write_manifest(path: str | Path, **fields: Any) -> dict[str, Any]:
    """Write ``manifest.json`` atomically with the command, versions and git sha added.

    Secrets never reach the file: the command's ``--api-key``/``--*-token`` values, keys,
    ``Authorization`` headers and URL passwords in any field are replaced by ``***``."""
    data = {
        "command": " ".join(redact_argv(sys.argv)),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_sha": git_sha(),
        "versions": versions(),
        **_redacted(fields),
    }
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return data
