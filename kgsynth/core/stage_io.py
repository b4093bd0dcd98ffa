"""Where a stage's outputs go, and how they get there without destroying anything.

Every stage writes one *output*: a file (``walks.parquet``, ``questions.parquet``, …) with its
sidecars named after it (``questions.manifest.json``, ``questions.rejected.parquet``,
``walks_stats.png``), or a folder (``filter``, ``eval``, ``eval --compare``)::

    with StagedOutput(out, inputs={"--walks": walks}, overwrite=overwrite) as staged:
        pq.write_table(table, staged.path())                 # questions.parquet
        write_manifest(staged.sidecar("manifest.json"), …)   # questions.manifest.json
        staged.commit()

What it guarantees:

- **No silent replacement.** An existing output is refused unless ``overwrite``; a folder is
  only replaced when it holds a kgsynth output (its ``manifest.json``) or nothing.
- **Inputs are safe.** An output (or a sidecar) that is one of the stage's inputs, lies inside an
  input folder (a KG store, a checkpoint), or would contain an input, is refused.
- **One writer.** A lock file beside the output (``.NAME.lock``, ``flock``) makes a second run
  on the same output fail at once with a message naming the holder's pid.
- **All or nothing.** Everything is written into ``.NAME.staging`` beside the output; a marker
  (``.NAME.commit``) written atomically is the commit point, after which the files are renamed
  into place. A crash before the marker leaves the old state (the staging folder is removed by
  the next run); a crash after it is rolled forward by the next run or reader (:func:`recover`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

from kgsynth.core.errors import ConfigError, OutputBusyError
from kgsynth.core.output_lock import OutputLock

log = logging.getLogger(__name__)

SIDECARS = ("manifest.json", "rejected.parquet")
"""Written beside a file output, named after it: ``questions.parquet`` → ``questions.manifest.json``."""


def sidecar(out: str | Path, name: str) -> Path:
    """``name`` beside the output ``out``, prefixed by its stem: ``questions.parquet`` and
    ``manifest.json`` give ``questions.manifest.json``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.{name}")


def stats_png(out: str | Path) -> Path:
    """The plot beside a file output: ``walks.parquet`` → ``walks_stats.png``."""
    out = Path(out)
    return out.with_name(f"{out.stem}_stats.png")


def owned_files(out: str | Path) -> list[Path]:
    """The files a file output consists of: itself, its sidecars and its plot."""
    out = Path(out)
    return [out, *(sidecar(out, n) for n in SIDECARS), stats_png(out)]


def absolute(path: str | Path) -> Path:
    """``path`` made absolute without resolving links: ``walks.parquet``, ``./walks.parquet``
    and ``''`` (the current folder) all get a parent and a name to put hidden files beside."""
    return Path(os.path.abspath(path))


def _hidden(out: Path, suffix: str) -> Path:
    return out.with_name(f".{out.name}.{suffix}")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` (so the commit marker never precedes the data)."""
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(folder)


# ---------------------------------------------------------------------------------------------
# checks


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


Inputs = dict[str, "str | Path | None"] | list[tuple[str, "str | Path | None"]]


def check_overlap(writes: list[Path], inputs: Inputs, flag: str = "--out") -> None:
    """Refuse when a path the stage writes (or replaces: a folder output) is one of its
    ``inputs`` (flag -> path, or (flag, path) pairs for a repeated flag), lies inside an input
    folder, or contains an input."""
    pairs = list(inputs.items()) if isinstance(inputs, dict) else list(inputs)
    for write in writes:
        w = Path(write).resolve()
        for name, given in pairs:
            if given is None or not str(given) or "://" in str(given):
                continue  # not given, or a server (an endpoint URL)
            p = Path(given).resolve()
            if w == p:
                what = "" if Path(write).name == Path(writes[0]).name else f" (as {w.name})"
                raise ConfigError(
                    f"{flag}: {writes[0]} would overwrite the input {name} {given}{what}; "
                    f"choose another {flag}"
                )
            if p.is_dir() and _inside(w, p):
                raise ConfigError(
                    f"{flag}: {writes[0]} lies inside the input {name} {given}; "
                    f"choose a {flag} outside it"
                )
            if _inside(p, w):
                raise ConfigError(
                    f"{flag}: {writes[0]} contains the input {name} {given}, which replacing "
                    f"it would delete; choose another {flag}"
                )


def _check_not_below_a_file(out: Path, flag: str) -> None:
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag}: {parent} is a file, so {out} cannot be created")
            return


def check_file_target(out: Path, flag: str = "--out") -> None:
    """``out`` names a file: not a directory, not below a file."""
    if out.is_dir():
        raise ConfigError(
            f"{flag}: {out} is a directory; give a file path such as {out}/out.parquet"
        )
    _check_not_below_a_file(out, flag)


def check_folder_target(out: Path, flag: str = "--out") -> None:
    """``out`` names a folder: not an existing file, not below a file."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag}: {out} is a file; this command writes a folder of outputs")
    here = absolute(".")
    if absolute(out) == here or absolute(out) in here.parents:
        raise ConfigError(
            f"{flag}: {out} is the current folder (or holds it); a folder output is replaced "
            f"whole, so give a new folder name such as {Path(out) / 'out'}"
        )
    _check_not_below_a_file(out, flag)


# ---------------------------------------------------------------------------------------------
# commit and recovery


def _marker(out: Path) -> Path:
    return _hidden(out, "commit")


def _staging(out: Path) -> Path:
    return _hidden(out, "staging")


def _old(out: Path) -> Path:
    return _hidden(out, "old")


MARKER_VERSION = 2


def _signature(out: Path, folder: bool, names: list[str], cleanup: list[str]) -> str:
    """What ties a commit marker to the one output it was written for: a digest of the
    output's absolute path and of the marker's content. A marker copied from elsewhere (another
    folder, another output, a run folder moved) or written by hand does not match it."""
    body = json.dumps(
        {"output": str(out), "folder": folder, "names": names, "cleanup": cleanup},
        sort_keys=True,
    )
    return hashlib.sha256(f"kgsynth-commit-{MARKER_VERSION}\n{body}".encode()).hexdigest()


def _cleanup_allowed(out: Path, path: Path) -> bool:
    """A path a commit may remove: a sibling of the output named after it (a walk's
    ``walks.parquet.parts``), never the output itself, one of its files, or anything else."""
    return (
        path.parent == out.parent
        and path.name.startswith(out.name + ".")
        and path.name not in {p.name for p in owned_files(out)}
    )


def _read_marker(out: Path) -> dict[str, Any] | None:
    """The commit marker of ``out`` if kgsynth wrote it for this very output, else None (after
    a warning naming the file): a stray, copied or damaged marker is reported and left alone."""
    marker = _marker(out)
    why = None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        data, why = None, f"not a kgsynth commit marker ({type(exc).__name__})"
    if why is None:
        fields = ("folder", "names", "cleanup", "output", "signature")
        if not isinstance(data, dict) or any(f not in data for f in fields):
            why = "not a kgsynth commit marker (fields missing)"
        elif data["output"] != str(out):
            why = f"written for another output ({data['output']})"
        elif not (
            isinstance(data["folder"], bool)
            and isinstance(data["names"], list)
            and all(isinstance(n, str) for n in data["names"])
            and isinstance(data["cleanup"], list)
            and all(isinstance(c, str) for c in data["cleanup"])
        ) or data["signature"] != _signature(out, data["folder"], data["names"], data["cleanup"]):
            why = "its signature does not match its content"
        elif not data["folder"] and (
            out.name not in data["names"]
            or not set(data["names"]) <= {p.name for p in owned_files(out)}
        ):
            why = "it names files that are not this output's"
        elif data["folder"] and out.exists() and not out.is_dir():
            why = "it says folder, but the output is a file"
        elif not all(_cleanup_allowed(out, Path(c)) for c in data["cleanup"]):
            why = "it would remove paths that are not this output's"
    if why is not None:
        log.warning("%s: left alone, %s", marker, why)
        return None
    return data


def _finish(out: Path) -> bool:
    """Roll a committed output forward: every step is idempotent, so a crash anywhere in
    here is finished by the next call. False (nothing done) when the marker is not one
    kgsynth wrote for ``out``."""
    marker = _marker(out)
    data = _read_marker(out)
    if data is None:
        return False
    staging, old = _staging(out), _old(out)
    if data["folder"]:
        if staging.exists():
            if out.exists():
                if old.exists():
                    shutil.rmtree(old)
                os.replace(out, old)
            os.replace(staging, out)
            _fsync_dir(out.parent)
        if old.exists():
            shutil.rmtree(old)
    else:
        names = set(data["names"])
        # the staging folder goes last, so while it is there the old files may still be
        # ours to replace; once it is gone every step before was done
        if staging.is_dir():
            for name in sorted(names):
                src = staging / name
                if src.exists():
                    os.replace(src, out.with_name(name))
            for path in owned_files(out):
                if path.name not in names and path.exists():
                    path.unlink()
            _fsync_dir(out.parent)
            shutil.rmtree(staging, ignore_errors=True)
    for extra in data["cleanup"]:
        shutil.rmtree(extra, ignore_errors=True)
    marker.unlink()
    _fsync_dir(out.parent)
    return True


def _recover_locked(out: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        _hidden(out, "commit.tmp").unlink()
    if _marker(out).exists() and _finish(out):
        return
    shutil.rmtree(_staging(out), ignore_errors=True)
    old = _old(out)
    if old.exists():  # only made after a marker; put it back rather than lose anything
        if out.exists():
            shutil.rmtree(old)
        else:
            os.replace(old, out)


def recover(out: str | Path) -> None:
    """Finish or undo an interrupted commit of ``out`` (a no-op when there is none). Readers
    call it on their inputs; a run writing ``out`` right now is left alone."""
    out = absolute(out)
    if not out.name:  # the root folder: nothing kgsynth writes
        return
    pending = [p for p in (_marker(out), _staging(out), _old(out)) if p.exists()]
    if not pending:
        return
    lock = OutputLock(out)
    try:
        lock.acquire()
    except OutputBusyError:
        return
    try:
        _recover_locked(out)
    finally:
        lock.release()


def recover_input(path: str | Path | None) -> None:
    """Recover ``path`` and the folder output it may lie in (``corpus/accepted.parquet``)."""
    if path is None:
        return
    path = absolute(path)
    recover(path)
    recover(path.parent)


class StagedOutput:
    """One stage run's output, written into a staging area and committed all at once.

    ``folder``: the output is a folder (every file the run writes goes inside it); otherwise
    a file with its sidecars beside it. ``inputs`` maps flags to the paths the stage reads.
    ``cleanup``: paths removed as part of the commit (a walk's resume chunks). ``names``: the
    files a folder output consists of, so that a folder holding only those (one written
    before outputs had a manifest) is also recognised as the stage's own."""

    def __init__(
        self,
        out: str | Path,
        *,
        folder: bool = False,
        overwrite: bool = False,
        inputs: Inputs | None = None,
        flag: str = "--out",
        cleanup: list[Path] | None = None,
        names: set[str] | frozenset[str] = frozenset(),
        resume: bool = False,
    ) -> None:
        if not str(out).strip():
            raise ConfigError(f"{flag}: an empty path; give the output's file or folder name")
        self.out = absolute(out)  # messages show it this way too
        if not self.out.name:
            raise ConfigError(f"{flag}: {out} is the root folder; give a file or folder name")
        # keep the staging folder a killed run left (its checkpoints) instead of removing it
        self.resume = resume
        self.resumed = False
        self.names = set(names)
        self.folder = folder
        self.overwrite = overwrite
        self.inputs = inputs or {}
        self.flag = flag
        self.cleanup = [absolute(p) for p in cleanup or []]
        for path in self.cleanup:
            if not _cleanup_allowed(self.out, path):
                raise ValueError(f"{path}: a commit only removes paths named after {self.out}")
        self.staging = _staging(self.out)
        self.lock = OutputLock(self.out, flag)
        self.committed = False

    # -- opening

    def __enter__(self) -> StagedOutput:
        if self.folder:
            check_folder_target(self.out, self.flag)
        else:
            check_file_target(self.out, self.flag)
        writes = [self.out] if self.folder else owned_files(self.out)
        check_overlap(writes, self.inputs, self.flag)
        self.lock.acquire()
        try:
            kept = _hidden(self.out, "resume")
            if self.resume and self.staging.is_dir() and not _marker(self.out).exists():
                shutil.rmtree(kept, ignore_errors=True)
                os.replace(self.staging, kept)
            _recover_locked(self.out)
            self._check_existing()
            if kept.is_dir():
                os.replace(kept, self.staging)
                self.resumed = True
            else:
                self.staging.mkdir(parents=True)
        except BaseException:
            self.lock.release()
            raise
        return self

    def _check_existing(self) -> None:
        out = self.out
        if self.folder:
            held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
            if not held:
                return
            if not self.overwrite:
                raise ConfigError(
                    f"{self.flag}: {out} already holds an output ({', '.join(held[:4])}"
                    f"{', …' if len(held) > 4 else ''}); pass --overwrite to replace it, or "
                    f"choose another {self.flag}"
                )
            if "manifest.json" not in held and not set(held) <= self.names:
                raise ConfigError(
                    f"{self.flag}: {out} holds files kgsynth did not write (no manifest.json); "
                    "--overwrite only replaces a kgsynth output: choose another folder"
                )
            return
        present = [p.name for p in owned_files(out) if p.exists()]
        if present and not self.overwrite:
            raise ConfigError(
                f"{self.flag}: {out} already exists ({', '.join(present)}); pass "
                f"--overwrite to replace it, or choose another {self.flag}"
            )

    # -- writing

    def path(self, name: str | None = None) -> Path:
        """Where to write the output (a file output) or ``name`` inside it (a folder)."""
        if self.folder:
            if name is None:
                raise ValueError("a folder output needs a file name")
            return self.staging / name
        return self.staging / (name or self.out.name)

    def sidecar(self, name: str) -> Path:
        """Where to write a sidecar of a file output (``manifest.json``, ``rejected.parquet``)."""
        return self.staging / sidecar(self.out, name).name

    def stats_png(self) -> Path:
        return self.staging / stats_png(self.out).name

    def write_manifest(self, stage: str, cfg: Any = None, **fields: Any) -> dict[str, Any]:
        """The output's manifest (``NAME.manifest.json`` beside a file output, ``manifest.json``
        inside a folder): the stage's name, its resolved config (a dataclass) and ``fields``,
        with the command, versions and git sha that :func:`kgsynth.core.manifest.write_manifest`
        adds. Returns what was written."""
        from kgsynth.core.config import config_record
        from kgsynth.core.manifest import write_manifest

        where = self.path("manifest.json") if self.folder else self.sidecar("manifest.json")
        if cfg is not None:
            fields = {"config": config_record(cfg), **fields}
        return write_manifest(where, stage=stage, **fields)

    def commit(self) -> None:
        """Make the staged files the output, all at once."""
        names = sorted(p.name for p in self.staging.iterdir())
        _fsync_tree(self.staging)
        marker = _marker(self.out)
        tmp = _hidden(self.out, "commit.tmp")
        cleanup = [str(absolute(p)) for p in self.cleanup]
        data = {
            "folder": self.folder,
            "names": names,
            "cleanup": cleanup,
            "output": str(self.out),
            "signature": _signature(self.out, self.folder, names, cleanup),
        }
        with open(tmp, "w") as fh:
            fh.write(json.dumps(data) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, marker)
        _fsync_dir(marker.parent)
        if not _finish(self.out):  # our own marker always matches: a bug if it does not
            raise RuntimeError(f"{marker}: the commit marker just written does not verify")
        self.committed = True

    # -- closing

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if not self.committed and not _marker(self.out).exists():
                shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self.lock.release()


__all__ = [
    "SIDECARS",
    "OutputLock",
    "StagedOutput",
    "check_file_target",
    "check_folder_target",
    "check_overlap",
    "owned_files",
    "recover",
    "recover_input",
    "sidecar",
    "stats_png",
]
