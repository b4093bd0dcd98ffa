"""`kgsynth walk --workers N` (issue 20): N processes give the file one process gives."""

import hashlib

import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.importer import import_kg
from kgsynth.kg.profiles import get_profile
from kgsynth.walk import WalkConfig, run_walks

MIX = "chain-1:0.2,chain-2:0.3,2I:0.2,IP:0.15,PI:0.15"


def small_kb(path):
    lines = []
    for i in range(300):
        lines.append(f"film {i}|directed_by|person {i % 37}")
        lines.append(f"film {i}|starred_actors|person {(i * 7) % 53}")
        lines.append(f"film {i}|release_year|{1950 + i % 40}")
        lines.append(f"film {i}|has_genre|genre {i % 9}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_two_workers_write_the_same_file_as_one(tmp_path):
    store = tmp_path / "kg"
    import_kg(small_kb(tmp_path / "kb.txt"), store)
    digests, manifests = [], []
    for workers in (1, 2):
        kg = EmbeddedKG.open(store)
        out = tmp_path / f"w{workers}.parquet"
        result = run_walks(kg, WalkConfig(n=150, seed=5, structures=MIX, workers=workers), out)
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
        result.pop("table")
        manifests.append({k: v for k, v in result.items() if k != "elapsed_s"})
    assert digests[0] == digests[1]
    assert manifests[0] == manifests[1]
    assert manifests[0]["accepted"] == 150


def test_workers_need_a_store_they_can_open(tmp_path):
    kg = EmbeddedKG.from_ntriples(
        "<http://x/a> <http://x/r> <http://x/b> .\n"
        '<http://x/a> <http://www.w3.org/2000/01/rdf-schema#label> "a" .\n'
        '<http://x/b> <http://www.w3.org/2000/01/rdf-schema#label> "b" .\n',
        get_profile("generic"),
    )
    with pytest.raises(ConfigError, match="--workers"):
        run_walks(
            kg, WalkConfig(n=1, seed=0, structures="chain-1", workers=2), tmp_path / "w.parquet"
        )


def test_workers_range_is_checked():
    with pytest.raises(ConfigError, match="--workers"):
        WalkConfig(workers=0)
