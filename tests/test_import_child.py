"""`kg import` converts a large delimited file in a child process (issue 20: the conversion's
memory is returned before the engine loads): the same store, name index and fan-out table as
in process, and its errors reach the user as they would in process."""

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kgsynth.core.errors import InputFileError, KGSynthError
from kgsynth.kg import delimited
from kgsynth.kg.fanouts import FANOUTS_DIR
from kgsynth.kg.importer import import_kg
from tests.test_import_batched import store_state


def fanout_files(store: Path) -> dict[str, object]:
    folder = store / FANOUTS_DIR
    out: dict[str, object] = {f.name: np.load(f).tolist() for f in sorted(folder.glob("*.npy"))}
    with pa.memory_map(str(folder / "entities.arrow")) as src:
        out["entities"] = pa.ipc.open_file(src).read_all().to_pylist()
    out["meta"] = (folder / "meta.json").read_text()
    return out


@pytest.fixture
def children(monkeypatch) -> list[int]:
    """Counts the child processes run; every file counts as large once ``CHILD_MIN_BYTES`` is 0."""
    made: list[int] = []
    real = delimited.spawn

    def spawn(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(delimited, "spawn", spawn)
    return made


def test_a_child_conversion_gives_the_same_store_and_table(tmp_path, monkeypatch, children):
    rels = ("directed_by", "starred_actors")
    lines = [f"Film {i % 23}|{rels[i % 2]}|Person {i % 17}" for i in range(300)]
    src = tmp_path / "kb.txt"
    src.write_text("\n".join(lines) + "\n", "utf-8")
    here = import_kg(src, tmp_path / "here")
    assert not children  # a small file is converted in process
    monkeypatch.setattr(delimited, "CHILD_MIN_BYTES", 0)
    child = import_kg(src, tmp_path / "child")
    assert children == [1]
    assert here.table_seconds is not None and child.table_seconds is not None
    timings = {"seconds": 0, "store": "", "store_bytes": 0, "table_seconds": 0}
    assert here.as_dict() | timings == child.as_dict() | timings
    assert (here.entities, here.facts) == (40, 300)
    assert store_state(tmp_path / "here") == store_state(tmp_path / "child")
    assert fanout_files(tmp_path / "here") == fanout_files(tmp_path / "child")


def test_errors_in_the_child_name_the_file_and_line(tmp_path, monkeypatch, children):
    monkeypatch.setattr(delimited, "CHILD_MIN_BYTES", 0)
    src = tmp_path / "kb.tsv"
    src.write_text("m1\tdirected_by\tp1\nm2\tdirected_by\tp2\n", "utf-8")
    names = tmp_path / "names.tsv"
    names.write_text("m1\tKismet\nno tab here\n", "utf-8")
    out = tmp_path / "kg"
    with pytest.raises(InputFileError, match=r"names\.tsv:2: expected 'id<TAB>name'") as err:
        import_kg(src, out, names_file=names)
    assert err.value.line == 2 and children
    # a line the batched reader leaves to the line-by-line one, which names it
    bad = tmp_path / "bad.txt"
    bad.write_text("a|r|b\nc|r|d|e\n", "utf-8")
    with pytest.raises(InputFileError, match=r"bad\.txt:2: expected 3 fields"):
        import_kg(bad, out)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kg.importing")]


def test_input_file_errors_survive_pickling():
    err = pickle.loads(pickle.dumps(InputFileError("kb.txt", "empty subject", 7)))
    assert str(err) == "kb.txt:7: empty subject" and err.line == 7 and err.path == "kb.txt"


def test_a_script_without_a_main_guard_can_import(tmp_path):
    """The child is a fresh interpreter running kgsynth's module, never the caller's script
    again (as multiprocessing's spawn would)."""
    import subprocess
    import sys

    src = tmp_path / "kb.txt"
    src.write_text("Kismet|directed_by|William Dieterle\n", "utf-8")
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "from kgsynth.kg import delimited\n"
        "from kgsynth.kg.importer import import_kg\n"
        "delimited.CHILD_MIN_BYTES = 0\n"
        "print('facts', import_kg(sys.argv[1], sys.argv[2]).facts)\n"
    )
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "kg")],
        capture_output=True, text=True, cwd=root, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "facts 1"


def test_a_child_that_dies_is_an_error_naming_the_file(tmp_path, monkeypatch):
    src = tmp_path / "kb.txt"
    src.write_text("Kismet|directed_by|William Dieterle\n", "utf-8")
    monkeypatch.setattr(delimited, "CHILD_MIN_BYTES", 0)
    monkeypatch.setattr(delimited, "spawn", lambda argv, level: -9)  # killed, wrote nothing
    with pytest.raises(
        KGSynthError, match=r"kb\.txt: the conversion's child process ended with exit code -9"
    ):
        import_kg(src, tmp_path / "kg")
    assert not (tmp_path / "kg").exists()
