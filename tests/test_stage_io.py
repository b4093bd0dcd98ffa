"""Outputs never destroy anything (issue 13, part 1): sidecars named after their output,
refusal without --overwrite, inputs protected, one writer per output, and all-or-nothing
commits that survive a kill at any point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kgsynth.core import stage_io
from kgsynth.core.errors import ConfigError, OutputBusyError
from kgsynth.core.stage_io import (
    OutputLock,
    StagedOutput,
    check_overlap,
    owned_files,
    recover,
    recover_input,
    sidecar,
)


def signed_marker(out: Path, names: list[str], cleanup: list[str] | None = None) -> dict:
    """A commit marker as kgsynth writes it for ``out`` (what a crash mid-commit leaves)."""
    out, cleanup = out.absolute(), cleanup or []
    signature = stage_io._signature(out, False, names, cleanup)
    return {"folder": False, "names": names, "cleanup": cleanup, "output": str(out),
            "signature": signature}  # fmt: skip


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def write_file_output(out: Path, tag: str, *, overwrite: bool = False, rejects: bool = True):
    with StagedOutput(out, overwrite=overwrite) as staged:
        staged.path().write_text(f"rows {tag}")
        staged.sidecar("manifest.json").write_text(json.dumps({"tag": tag}))
        if rejects:
            staged.sidecar("rejected.parquet").write_text(f"rejects {tag}")
        staged.commit()


def test_sidecars_are_named_after_their_output(tmp_path: Path) -> None:
    out = tmp_path / "questions.parquet"
    assert sidecar(out, "manifest.json").name == "questions.manifest.json"
    assert [p.name for p in owned_files(out)] == [
        "questions.parquet",
        "questions.manifest.json",
        "questions.rejected.parquet",
        "questions_stats.png",
    ]
    # two stages in one folder keep their own sidecars
    write_file_output(tmp_path / "walks.parquet", "w")
    write_file_output(tmp_path / "questions.parquet", "q")
    assert listing(tmp_path) == [
        "questions.manifest.json",
        "questions.parquet",
        "questions.rejected.parquet",
        "walks.manifest.json",
        "walks.parquet",
        "walks.rejected.parquet",
    ]


def test_an_existing_output_is_refused_then_replaced_whole_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "q.parquet"
    write_file_output(out, "old")
    with pytest.raises(ConfigError, match=r"already exists .*--overwrite"):
        write_file_output(out, "new")
    assert out.read_text() == "rows old"
    # the new run writes no rejects: the old rejects go too, so no file mixes two runs
    write_file_output(out, "new", overwrite=True, rejects=False)
    assert listing(tmp_path) == ["q.manifest.json", "q.parquet"]
    assert json.loads(sidecar(out, "manifest.json").read_text()) == {"tag": "new"}


def test_a_run_that_fails_leaves_the_old_state_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "q.parquet"
    write_file_output(out, "old")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    with pytest.raises(RuntimeError), StagedOutput(out, overwrite=True) as staged:
        staged.path().write_text("half")
        raise RuntimeError("the model server went away")
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_folder_outputs_replace_only_what_kgsynth_wrote(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    with StagedOutput(out, folder=True) as staged:
        staged.path("accepted.parquet").write_text("a")
        staged.path("manifest.json").write_text("{}")
        staged.commit()
    assert listing(out) == ["accepted.parquet", "manifest.json"]
    with pytest.raises(ConfigError, match="already holds an output"):
        StagedOutput(out, folder=True).__enter__()
    with StagedOutput(out, folder=True, overwrite=True) as staged:
        staged.path("accepted.parquet").write_text("b")
        staged.path("manifest.json").write_text("{}")
        staged.commit()
    assert (out / "accepted.parquet").read_text() == "b"
    assert listing(tmp_path) == ["corpus"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="did not write"):
        StagedOutput(mine, folder=True, overwrite=True).__enter__()
    assert (mine / "notes.txt").read_text() == "keep"


def test_inputs_are_never_outputs(tmp_path: Path) -> None:
    store = tmp_path / "kg"
    store.mkdir()
    walks = tmp_path / "walks.parquet"
    walks.write_text("w")
    with pytest.raises(ConfigError, match="would overwrite the input --walks"):
        check_overlap(owned_files(walks), {"--walks": walks})
    with pytest.raises(ConfigError, match=r"as walks\.manifest\.json"):
        check_overlap(
            owned_files(tmp_path / "walks.x"), {"--manifest": tmp_path / "walks.manifest.json"}
        )
    with pytest.raises(ConfigError, match="inside the input --kg"):
        check_overlap(owned_files(store / "q.parquet"), {"--kg": store})
    with pytest.raises(ConfigError, match="contains the input --in"):
        check_overlap([tmp_path], [("--in", walks)])
    check_overlap([tmp_path / "out"], [("--kg", "http://127.0.0.1:7878/query"), ("--x", None)])


def test_a_second_writer_is_told_who_holds_the_output(tmp_path: Path) -> None:
    out = tmp_path / "q.parquet"
    with StagedOutput(out):
        with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"):
            StagedOutput(out).__enter__()
        assert OutputBusyError.exit_code == 6
    assert listing(tmp_path) == []  # the lock file goes with the run
    # a lock left by a killed process is not held: the next run takes it
    (tmp_path / ".q.lock").write_text("12345\n")
    with OutputLock(out):
        pass
    assert listing(tmp_path) == []


KILLER = """
import os, sys
from pathlib import Path
from kgsynth.core import stage_io
from kgsynth.core.stage_io import StagedOutput

out, folder, die_after = Path(sys.argv[1]), sys.argv[2] == "folder", int(sys.argv[3])
real, calls = os.replace, []

def replace(a, b):  # kill -9 right after the die_after-th rename
    real(a, b)
    calls.append(b)
    if len(calls) == die_after:
        os.kill(os.getpid(), 9)

stage_io.os.replace = replace
if folder:
    names = ["accepted.parquet", "rejected.parquet", "manifest.json"]
else:
    names = [out.name, out.stem + ".manifest.json", out.stem + ".rejected.parquet"]
with StagedOutput(out, folder=folder, overwrite=True) as staged:
    for name in names:
        (staged.staging / name).write_text("new " + name)
    staged.commit()
"""


@pytest.mark.parametrize("folder", [False, True], ids=["file", "folder"])
def test_a_kill_anywhere_in_a_commit_leaves_old_or_new_never_a_mix(
    tmp_path: Path, folder: bool
) -> None:
    script = tmp_path / "killer.py"
    script.write_text(textwrap.dedent(KILLER))
    seen = set()
    for die_after in range(1, 6):
        root = tmp_path / f"k{die_after}"
        root.mkdir()
        out = root / ("corpus" if folder else "q.parquet")
        if folder:
            out.mkdir()
            for name in ("accepted.parquet", "rejected.parquet", "manifest.json", "old.png"):
                (out / name).write_text("old " + name)
        else:
            for p in owned_files(out)[:3]:
                p.write_text("old")
        proc = subprocess.run(
            [sys.executable, str(script), str(out), "folder" if folder else "file", str(die_after)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
        # a reader (or the next run) recovers first
        recover_input(out / "accepted.parquet" if folder else out)
        files = sorted(out.iterdir()) if folder else sorted(p for p in root.iterdir())
        contents = {p.name: p.read_text() for p in files}
        states = {v.split()[0] for v in contents.values()}
        assert len(states) == 1, contents  # all old or all new
        state = states.pop()
        seen.add(state)
        if state == "new":
            assert len(contents) == 3, contents
        assert not [p for p in root.iterdir() if p.name.startswith(".")], listing(root)
    assert seen == {"new"}  # the marker comes before the first rename: always rolled forward


def test_an_interrupted_commit_is_rolled_forward_by_recover(tmp_path: Path) -> None:
    out = tmp_path / "q.parquet"
    write_file_output(out, "old")
    staging = tmp_path / ".q.parquet.staging"
    staging.mkdir()
    (staging / "q.parquet").write_text("rows new")
    (tmp_path / ".q.parquet.commit").write_text(
        json.dumps(signed_marker(out, ["q.manifest.json", "q.parquet"]))
    )
    (tmp_path / "q.manifest.json").write_text('{"tag": "new"}')  # moved before the crash
    recover(out)
    assert listing(tmp_path) == ["q.manifest.json", "q.parquet"]
    assert out.read_text() == "rows new"
    # staging without a marker: the run died before committing; the old state stays
    staging.mkdir()
    (staging / "q.parquet").write_text("half")
    recover(out)
    assert listing(tmp_path) == ["q.manifest.json", "q.parquet"] and out.read_text() == "rows new"


def test_a_second_walk_on_a_busy_output_exits_6_and_the_first_finishes(tmp_path: Path) -> None:
    kb = tmp_path / "kb.txt"
    kb.write_text(
        "\n".join(
            f"Film {i}|directed_by|Person {i % 37}\nFilm {i}|starred_actors|Actor {i % 53}"
            for i in range(400)
        )
        + "\n"
    )
    out = tmp_path / "run" / "walks.parquet"
    script = Path(sys.executable).parent / "kgsynth"
    exe = [str(script)] if script.is_file() else [sys.executable, "-m", "kgsynth.cli"]
    cmd = [*exe, "walk", "--kg", str(kb), "--out", str(out), "--n", "200"]
    cmd += ["--structures", "chain-1:1,chain-2:1", "--chunk-size", "50"]
    with OutputLock(out):  # as a first run would hold it
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert second.returncode == 6, second.stderr
    assert f"being written by another kgsynth run (pid {os.getpid()})" in second.stderr
    assert "Traceback" not in second.stderr and not out.exists()
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert listing(out.parent) == ["walks.manifest.json", "walks.parquet", "walks_stats.png"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_training_never_writes_into_or_over_what_it_reads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kgsynth.cli import app

    ckpt = tmp_path / "stage1"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    corpus = tmp_path / "corpus.parquet"
    corpus.write_bytes(b"PAR1")
    before = listing(tmp_path)
    base = ["train", "stage2", "--corpus", str(corpus), "--init", str(ckpt)]
    cases = {
        str(ckpt): "would overwrite the input --init",
        str(ckpt / "sub"): "inside the input --init",
        str(tmp_path): "contains the input --corpus",
    }
    for out, message in cases.items():
        res = CliRunner().invoke(app, [*base, "--out", out, "--overwrite"])
        assert res.exit_code == 2 and message in res.output, (out, res.output)
    assert listing(tmp_path) == before and listing(ckpt) == ["config.json"]


def test_a_folder_of_the_stages_own_files_is_replaced_with_overwrite(tmp_path: Path) -> None:
    # e.g. an `eval --compare` summary written before outputs had a manifest
    out = tmp_path / "summary"
    out.mkdir()
    (out / "compare.md").write_text("old")
    names = {"compare.md", "compare.png", "manifest.json"}
    with StagedOutput(out, folder=True, overwrite=True, names=names) as staged:
        staged.path("compare.md").write_text("new")
        staged.commit()
    assert (out / "compare.md").read_text() == "new"
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="did not write"):
        StagedOutput(out, folder=True, overwrite=True, names=names).__enter__()


def _input_beside(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    walks = tmp_path / "walks.parquet"
    write_file_output(walks, "w")
    (tmp_path / "walks_stats.png").write_bytes(b"png")
    return walks, {p.name: p.read_bytes() for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    "marker",
    [
        # the case: no names, a cleanup of a folder elsewhere
        {"folder": False, "names": [], "cleanup": ["{victim}"]},
        # a marker with every field, but not signed for this output
        {"folder": False, "names": [], "cleanup": ["{victim}"], "output": "{out}",
         "signature": "0" * 64},
        # signed correctly, but for the same file in another folder (a copied run folder)
        "copied",
        # a correctly signed marker cannot name a folder that is not the output's
        "outside",
        "garbage",
    ],
    ids=["bare", "forged", "copied", "outside", "garbage"],
)  # fmt: skip
def test_a_stray_commit_marker_is_reported_and_touches_nothing(
    tmp_path: Path, marker: object, caplog: pytest.LogCaptureFixture
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    victim = tmp_path / "some" / "dir"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("keep")
    walks, before = _input_beside(work)
    out = walks.absolute()
    if marker == "copied":
        elsewhere = tmp_path / "elsewhere" / "walks.parquet"
        elsewhere.parent.mkdir()
        text = json.dumps(signed_marker(elsewhere, []))
    elif marker == "outside":
        data = signed_marker(out, ["walks.parquet"], [str(victim)])
        text = json.dumps(data)
    elif marker == "garbage":
        text = "{not json"
    else:
        text = json.dumps(marker).replace("{victim}", str(victim)).replace("{out}", str(out))
    (work / ".walks.parquet.commit").write_text(text)
    before[".walks.parquet.commit"] = text.encode()
    recover_input(walks)  # what every stage does to its inputs
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before
    assert (victim / "keep.txt").read_text() == "keep"
    assert "left alone" in caplog.text
    # and a stage writing that output later replaces the stray marker with its own
    write_file_output(walks, "new", overwrite=True)
    assert walks.read_text() == "rows new" and not (work / ".walks.parquet.commit").exists()


PATH_FORMS = ["q.parquet", "./q.parquet", "sub/q.parquet", "../w/q.parquet"]


@pytest.mark.parametrize("form", PATH_FORMS)
def test_outputs_and_inputs_work_in_every_relative_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    work = tmp_path / "w"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    write_file_output(Path(form), "one")
    assert Path(form).read_text() == "rows one"
    recover_input(Path(form))  # parent "." or "..": no crash, nothing changes
    recover_input(Path("missing.parquet"))
    recover(Path("/"))
    assert Path(form).read_text() == "rows one"
    assert not [p for p in Path(form).parent.iterdir() if p.name.startswith(".")]


def test_the_current_folder_is_refused_as_an_output_with_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="is a directory"):
        write_file_output(Path("."), "x")
    with pytest.raises(ConfigError, match="current folder"):
        StagedOutput(Path("."), folder=True).__enter__()
    with pytest.raises(ConfigError, match="current folder"):
        StagedOutput(Path(".."), folder=True).__enter__()
    with pytest.raises(ConfigError, match="empty path"):
        StagedOutput("", folder=True)
    assert listing(tmp_path) == []


def test_outputs_that_share_sidecars_share_one_lock(tmp_path: Path) -> None:
    with StagedOutput(tmp_path / "walks.parquet"), pytest.raises(OutputBusyError):
        StagedOutput(tmp_path / "walks.pq").__enter__()
