"""Every command, every path form, every corrupted input: one line, never a traceback (issue 41).

Property-based (hypothesis) over the real CLI, in process:

- **Path forms.** Each file-reading command gets its input and its output in a form drawn from
  bare (``walks.parquet`` in the current folder), ``./``, ``sub/``, ``../``, absolute, a symlink,
  and folders with spaces or non-ASCII names; the output may also be ``.`` or ``''``. A usable
  form runs and writes where the path says; ``.`` and ``''`` end with one ``error:`` line.
- **Corruption.** A column of an input Parquet file is dropped, nulled or given another type,
  or the file is cut short or replaced by noise. The command either runs or ends with one
  ``error:`` line that names the file (and the column, for a column's corruption).
- **Disk full** (a 300 KB tmpfs; root only) and **Ctrl-C** of a walk with two workers end with
  one line, and leave the old outputs and nothing else.

Every case also checks that the inputs are unchanged. A slice runs in the default suite; the
``slow`` variants draw many more examples and add ``train stage1``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kgsynth.cli import app
from tests.kgfixtures import build_pipeline_inputs, generated_movie_facts

runner = CliRunner()


# ---------------------------------------------------------------------------------------------
# inputs, built once


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store, walks, questions, oracle trajectories and a filtered corpus of the movie
    fixture, in one folder."""
    root = tmp_path_factory.mktemp("hostile")
    paths = build_pipeline_inputs(root, walks=30, structures="chain-1,chain-2")
    for args in (
        ["synthesize", "trajectories", "--questions", str(paths["questions"]), "--kg",
         str(paths["store"]), "--out", str(root / "trajectories.parquet")],
        ["filter", "--in", str(root / "trajectories.parquet"), "--out", str(root / "corpus")],
    ):  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    return root


def digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` by relative path (folders as "dir")."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def one_error_line(res, *needles: str) -> str:
    """The run failed with exactly one ``error:`` line, the last on stderr, holding each of
    ``needles``; no traceback, no internal error."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code != 0, res.output
    stderr = res.stderr
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    # a message may wrap at the console's width: compare without line breaks
    text = " ".join(stderr.split())
    assert "internal error" not in text, text
    for needle in needles:
        assert " ".join(needle.split()) in text, (needle, text)
    return errors[0]


@contextlib.contextmanager
def cwd(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


# ---------------------------------------------------------------------------------------------
# commands and path forms


@dataclass(frozen=True)
class Command:
    """A command with one input and one output: ``argv`` holds ``{in}`` and ``{out}`` (and
    ``{store}``, the KG as an absolute path); ``source`` is the input's name in ``base``;
    ``folder``: the output is a folder."""

    name: str
    argv: tuple[str, ...]
    source: str
    out_name: str
    folder: bool = False


COMMANDS = {
    "walk": Command(
        "walk", ("walk", "--kg", "{in}", "--out", "{out}", "--n", "4", "--structures", "chain-1"),
        "store", "w.parquet",
    ),
    "questions": Command(
        "questions", ("synthesize", "questions", "--walks", "{in}", "--out", "{out}"),
        "walks.parquet", "q.parquet",
    ),
    "trajectories": Command(
        "trajectories",
        ("synthesize", "trajectories", "--questions", "{in}", "--kg", "{store}", "--out", "{out}"),
        "questions.parquet", "t.parquet",
    ),
    "filter": Command(
        "filter", ("filter", "--in", "{in}", "--out", "{out}"), "trajectories.parquet", "f",
        folder=True,
    ),
    "import": Command(
        "import", ("kg", "import", "{in}", "--out", "{out}"), "kb.txt", "s", folder=True
    ),
    "stage1": Command(
        "stage1",
        ("train", "stage1", "--corpus", "{in}", "--out", "{out}", "--model", "tiny",
         "--max-steps", "1", "--batch-size", "2", "--micro-batch-size", "2",
         "--tiny-vocab-size", "300", "--max-length", "1024"),
        "corpus/accepted.parquet", "s1", folder=True,
    ),
}  # fmt: skip
FAST = [c for c in COMMANDS if c != "stage1"]

FOLDERS = ["data", "my data", "données ∂"]
IN_FORMS = ["bare", "dot", "sub", "up", "absolute", "symlink"]
OUT_FORMS = ["bare", "dot", "sub", "up", "absolute", "dot-only", "empty"]


def _lay_out(base: Path, root: Path, cmd: Command, folder: str) -> tuple[Path, Path]:
    """The command's input copied into ``root/<folder>``; returns (input path, KG store)."""
    data = root / folder
    data.mkdir(parents=True)
    source = base / cmd.source
    target = data / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    shutil.copytree(base / "store", root / "kgstore")
    (root / "elsewhere").mkdir()
    return target, root / "kgstore"


def _input_arg(form: str, target: Path, root: Path) -> tuple[str, Path]:
    """(the argument, the folder to run in) for the input ``target`` in ``form``."""
    data = target.parent
    if form == "bare":
        return target.name, data
    if form == "dot":
        return f"./{target.name}", data
    if form == "sub":
        return f"{data.name}/{target.name}", root
    if form == "up":
        return f"../{data.name}/{target.name}", root / "elsewhere"
    if form == "symlink":
        link = root / ("link-" + target.name)
        link.symlink_to(target, target_is_directory=target.is_dir())
        return link.name, root
    return str(target), root / "elsewhere"


def _output_arg(form: str, name: str, here: Path, root: Path) -> tuple[str, Path | None]:
    """(the argument, where the output must appear, None when the form must be refused)."""
    if form == "bare":
        return name, here / name
    if form == "dot":
        return f"./{name}", here / name
    if form == "sub":
        return f"out sub/{name}", here / "out sub" / name
    if form == "up":
        return f"../{name}", here.parent / name
    if form == "absolute":
        return str(root / "abs out" / name), root / "abs out" / name
    return ("." if form == "dot-only" else ""), None


def run_path_case(base: Path, command: str, folder: str, in_form: str, out_form: str) -> None:
    cmd = COMMANDS[command]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "r"  # one level down: a "../" output stays inside the temporary folder
        target, store = _lay_out(base, root, cmd, folder)
        arg_in, here = _input_arg(in_form, target, root)
        arg_out, expected = _output_arg(out_form, cmd.out_name, here, root)
        fill = {"{in}": arg_in, "{out}": arg_out, "{store}": str(store)}
        argv = [fill.get(a, a) for a in cmd.argv]
        before = digest(target.parent)
        with cwd(here):
            res = runner.invoke(app, argv)
        if expected is None:
            one_error_line(res, "--out")
        else:
            assert res.exit_code == 0, (argv, res.output)
            assert expected.is_dir() if cmd.folder else expected.is_file(), (argv, res.output)
            # nothing hidden (staging, lock, marker) is left beside the output
            assert not [p for p in expected.parent.iterdir() if p.name.startswith(".")]
        if expected is None or not _inside(expected, target.parent):
            assert digest(target.parent) == before, argv


def _inside(path: Path, folder: Path) -> bool:
    return folder.resolve() in path.resolve().parents


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


FORMS = dict(
    folder=st.sampled_from(FOLDERS),
    in_form=st.sampled_from(IN_FORMS),
    out_form=st.sampled_from(OUT_FORMS),
)


@settings(max_examples=18, **SETTINGS)
@given(command=st.sampled_from(FAST), **FORMS)
def test_every_path_form_runs_or_gets_one_line(
    base: Path, command: str, folder: str, in_form: str, out_form: str
) -> None:
    run_path_case(base, command, folder, in_form, out_form)


@pytest.mark.parametrize("command", FAST)
def test_a_bare_input_and_output_in_the_current_folder(base: Path, command: str) -> None:
    """The issue's first case for each command: ``cd x && kgsynth … walks.parquet …``."""
    run_path_case(base, command, "data", "bare", "bare")
    run_path_case(base, command, "data", "bare", "dot-only")


def test_a_missing_bare_input_says_no_such_file(tmp_path: Path) -> None:
    with cwd(tmp_path):
        res = runner.invoke(app, ["synthesize", "questions", "--walks", "walks.parquet",
                                  "--out", "q.parquet"])  # fmt: skip
    one_error_line(res, "walks.parquet", "no such file")


@pytest.mark.slow
@settings(max_examples=150, **SETTINGS)
@given(command=st.sampled_from(list(COMMANDS)), **FORMS)
def test_every_path_form_of_every_command_slow(
    base: Path, command: str, folder: str, in_form: str, out_form: str
) -> None:
    run_path_case(base, command, folder, in_form, out_form)


# ---------------------------------------------------------------------------------------------
# corrupted inputs

CORRUPTIONS = ["drop", "null", "as-string", "as-int", "as-list", "truncate", "noise", "no-rows"]
CONSUMERS = {  # input file -> the command that reads it
    "walks.parquet": "questions",
    "questions.parquet": "trajectories",
    "trajectories.parquet": "filter",
}


def corrupt(path: Path, how: str, column: str, seed: int) -> None:
    """Damage the Parquet file ``path`` in place: ``how`` one of :data:`CORRUPTIONS`."""
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: seed % max(1, len(data) - 1)])
        return
    if how == "noise":
        path.write_bytes(hashlib.sha256(str(seed).encode()).digest() * (1 + seed % 40))
        return
    table = pq.read_table(path)
    if how == "no-rows":
        pq.write_table(table.slice(0, 0), path)
        return
    index = table.column_names.index(column)
    n = table.num_rows
    if how == "drop":
        table = table.remove_column(index)
    else:
        column_type = table.schema.field(column).type
        value = {
            "null": pa.nulls(n, column_type),
            "as-string": pa.array([f"x{i}" for i in range(n)]),
            "as-int": pa.array(list(range(n)), pa.int64()),
            "as-list": pa.array([[i] for i in range(n)], pa.list_(pa.int64())),
        }[how]
        table = table.set_column(index, pa.field(column, value.type), value)
    pq.write_table(table, path)


def run_corruption_case(base: Path, name: str, how: str, pick: int, seed: int) -> None:
    cmd = COMMANDS[CONSUMERS[name]]
    columns = pq.read_schema(base / name).names
    column = columns[pick % len(columns)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, store = _lay_out(base, root, cmd, "data")
        corrupt(target, how, column, seed)
        before = digest(target.parent)
        fill = {"{in}": str(target), "{out}": str(root / cmd.out_name), "{store}": str(store)}
        res = runner.invoke(app, [fill.get(a, a) for a in cmd.argv])
        if res.exit_code != 0:
            needles = [target.name] + ([column] if how not in ("truncate", "noise") else [])
            if how == "no-rows":
                needles = [target.name]
            one_error_line(res, *needles)
        else:
            assert res.exception is None, repr(res.exception)
            assert "Traceback" not in res.stderr
        assert digest(target.parent) == before


CORRUPTION_CASES = dict(
    name=st.sampled_from(list(CONSUMERS)),
    how=st.sampled_from(CORRUPTIONS),
    pick=st.integers(0, 40),
    seed=st.integers(1, 10_000),
)


@settings(max_examples=30, **SETTINGS)
@given(**CORRUPTION_CASES)
def test_a_corrupted_input_runs_or_gets_one_line_naming_file_and_column(
    base: Path, name: str, how: str, pick: int, seed: int
) -> None:
    run_corruption_case(base, name, how, pick, seed)


@pytest.mark.slow
@settings(max_examples=300, **SETTINGS)
@given(**CORRUPTION_CASES)
def test_a_corrupted_input_runs_or_gets_one_line_slow(
    base: Path, name: str, how: str, pick: int, seed: int
) -> None:
    run_corruption_case(base, name, how, pick, seed)


# ---------------------------------------------------------------------------------------------
# disk full, Ctrl-C


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 300 KB tmpfs (skips where it cannot be mounted: not root, or no mount rights)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("command", FAST)
def test_a_full_disk_gets_one_line_and_keeps_the_old_output(
    base: Path, small_disk: Path, command: str
) -> None:
    cmd = COMMANDS[command]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, store = _lay_out(base, root, cmd, "data")
        out = small_disk / cmd.out_name
        # an older output of the same name, which a failed run must leave as it was
        if command == "import":
            pass  # only a store could be replaced: there is none, and none may be left
        elif cmd.folder:
            out.mkdir()
            (out / "manifest.json").write_text('{"old": true}')
        else:
            out.write_text("old")
        filler = small_disk / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as fh:
            fh.write(b"\0" * (300 * 1024 - 4 * 1024))
        before_disk = digest(small_disk)
        before_in = digest(target.parent)
        fill = {"{in}": str(target), "{out}": str(out), "{store}": str(store)}
        argv = [fill.get(a, a) for a in cmd.argv] + ["--overwrite"]
        res = runner.invoke(app, argv)
        line = " ".join(one_error_line(res).split()).lower()
        assert "no space left" in line or "disk is full" in line, line
        assert digest(small_disk) == before_disk, res.stderr  # the old output, nothing else
        assert digest(target.parent) == before_in


def test_ctrl_c_of_a_walk_with_two_workers_is_one_line(tmp_path: Path) -> None:
    kb = tmp_path / "kb.txt"
    facts = generated_movie_facts(movies=400)
    kb.write_text("\n".join("|".join(f) for f in facts) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    kgsynth = [sys.executable, "-m", "kgsynth.cli"]
    subprocess.run([*kgsynth, "kg", "import", str(kb), "--out", str(tmp_path / "s")],
                   check=True, capture_output=True, env=env)  # fmt: skip
    out = tmp_path / "w.parquet"
    proc = subprocess.Popen(
        [*kgsynth, "walk", "--kg", str(tmp_path / "s"), "--out", str(out), "--n", "1000000",
         "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its own process group, as a terminal's job is
    )  # fmt: skip
    time.sleep(8)  # the workers have started and are walking
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: every process of the group
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and "interrupted" in lines[-1], stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".staging", ".lock"))]


# ---------------------------------------------------------------------------------------------
# the sites the issue named, each once (the properties above may not draw them)


@pytest.mark.parametrize(
    ("name", "column", "how"),
    [
        ("walks.parquet", "hops", "as-string"),
        ("walks.parquet", "sparql", "as-int"),
        ("questions.parquet", "structure", "as-int"),
    ],
)
def test_a_carried_column_of_the_wrong_type_is_refused_before_any_row(
    base: Path, name: str, column: str, how: str
) -> None:
    pick = pq.read_schema(base / name).names.index(column)
    cmd = COMMANDS[CONSUMERS[name]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, store = _lay_out(base, root, cmd, "data")
        corrupt(target, how, column, seed=1)
        fill = {"{in}": str(target), "{out}": str(root / cmd.out_name), "{store}": str(store)}
        res = runner.invoke(app, [fill.get(a, a) for a in cmd.argv])
        assert res.exit_code == 3, res.stderr  # an input file error
        one_error_line(res, target.name, f"column {column} has type")
    assert pick >= 0


def test_numbers_past_what_the_machine_holds_are_config_errors(base: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["walk", "--kg", str(base / "store"), "--out",
                              str(tmp_path / "w.parquet"), "--seed", str(10**23)])  # fmt: skip
    assert res.exit_code == 2
    one_error_line(res, "--seed", "64-bit")
    for timeout in ("1e308", "nan", "inf", "0"):
        res = runner.invoke(app, ["kg", "query", "--kg", str(base / "store"), "--timeout",
                                  timeout, "SELECT * WHERE { ?s ?p ?o } LIMIT 1"])  # fmt: skip
        assert res.exit_code == 2, (timeout, res.output)
        one_error_line(res, "--timeout")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("device", "needle"), [("tpu9", "not a device"), ("cuda", "not available")]
)
def test_a_device_this_machine_lacks_is_one_line(
    base: Path, tmp_path: Path, device: str, needle: str
) -> None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the device is checked before any weight loads
    questions = base / "questions.parquet"
    res = runner.invoke(app, ["eval", "--questions", str(questions), "--kg", str(base / "store"),
                              "--model", str(model), "--device", device,
                              "--out", str(tmp_path / "e")])  # fmt: skip
    assert res.exit_code == 2, res.output
    one_error_line(res, "--device", device, needle)


def test_a_reply_nested_past_the_recursion_limit_is_a_failed_request(
    base: Path, tmp_path: Path
) -> None:
    from tests.llm_servers import FakeOpenAIServer, Reply

    deep = b'{"choices": [' + b'{"a": [' * 100_000 + b"1" + b"]}" * 100_000 + b"]}"
    with FakeOpenAIServer([Reply(body=deep)]) as fake:
        res = runner.invoke(app, ["synthesize", "questions", "--walks",
                                  str(base / "walks.parquet"), "--out", str(tmp_path / "q.parquet"),
                                  "--llm", "openai", "--model", "m", "--api-key", "k",
                                  "--base-url", fake.base_url, "--max-retries", "0",
                                  "--limit", "2"])  # fmt: skip
    one_error_line(res, "requests failed")
    # a failed request whose reason the line names, not a crash
    assert "unreadable response" in res.output and "Traceback" not in res.output


@pytest.mark.slow
@pytest.mark.parametrize("command", ["stage1", "report"])
def test_a_full_disk_in_training_and_the_report_is_one_line(
    base: Path, small_disk: Path, command: str
) -> None:
    """The tiny model's build (``kgsynth/train/tiny.py``) and the report's page on a full disk."""
    filler = small_disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as fh:
        fh.write(b"\0" * (300 * 1024 - 4 * 1024))
    before = digest(small_disk)
    if command == "stage1":
        cmd = COMMANDS["stage1"]
        fill = {"{in}": str(base / cmd.source), "{out}": str(small_disk / "s1")}
        argv = [fill.get(a, a) for a in cmd.argv]
    else:
        argv = ["report", str(base), "--out", str(small_disk / "report.html")]
    res = runner.invoke(app, argv)
    line = " ".join(one_error_line(res).split()).lower()
    assert "no space left" in line or "disk is full" in line, line
    assert digest(small_disk) == before


def test_a_usage_error_is_the_usage_message_not_an_internal_error(tmp_path: Path) -> None:
    res = runner.invoke(app, ["filter", "--in", "a", "b", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    assert "internal error" not in res.output and "unexpected extra argument" in res.output
