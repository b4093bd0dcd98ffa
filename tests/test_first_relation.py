"""benchmarks/first_relation.py: the first relation a MetaQA question asks, read off its type,
against the agent's first get_triples call, per hop and paired between two evals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import polars as pl

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "first_relation.py"
spec = importlib.util.spec_from_file_location("first_relation", SCRIPT)
first_relation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(first_relation)


def test_wanted_reads_the_hop_from_the_topic() -> None:
    assert first_relation.wanted("movie_to_director_to_movie_to_year") == "directed_by"
    assert first_relation.wanted("actor_to_movie_to_genre") == "starred_actors"
    assert first_relation.wanted("movie_to_writer") == "written_by"
    assert first_relation.wanted("movie") is None
    assert first_relation.wanted("") is None


def turns(*calls: tuple[str, list]) -> list[dict]:
    return [{"tool": tool, "args": json.dumps(args)} for tool, args in calls]


def test_first_followed_skips_relation_lists() -> None:
    t = turns(("get_relations", ["X"]), ("get_triples", ["X", ["directed_by", "has_genre"]]))
    assert first_relation.first_followed(t) == "directed_by"
    assert first_relation.first_followed(turns(("get_relations", ["X"]))) is None
    assert first_relation.first_followed([{"tool": "get_triples", "args": "not json"}]) is None


def write_eval(folder: Path, rows: list[tuple[str, str, str, float]]) -> Path:
    folder.mkdir(parents=True)
    frame = pl.DataFrame(
        {
            "system": ["model"] * len(rows),
            "question_id": [r[0] for r in rows],
            "qtype": [r[1] for r in rows],
            "hops": [len(r[1].split("_to_")) - 1 for r in rows],
            "hits_at_1": [r[3] for r in rows],
            "turns": [turns(("get_triples", ["T", [r[2]]])) for r in rows],
        }
    )
    frame.write_parquet(folder / "predictions.parquet")
    return folder


def test_tables_and_pair(tmp_path: Path, capsys) -> None:
    q3 = "movie_to_director_to_movie_to_year"
    a = write_eval(
        tmp_path / "a",
        [
            ("q1", q3, "release_year", 0.0),
            ("q2", q3, "directed_by", 1.0),
            ("q3", q3, "directed_by", 1.0),
        ],
    )
    b = write_eval(
        tmp_path / "b",
        [
            ("q1", q3, "directed_by", 1.0),
            ("q2", q3, "directed_by", 1.0),
            ("q3", q3, "directed_by", 0.0),
        ],
    )
    assert first_relation.main([str(a), str(b), "--pair"]) == 0
    out = capsys.readouterr().out
    assert "| 3 | 3 | 0.667 | 1.000 | 0.000 |" in out
    assert "| 3 | 3 | 1.000 | 0.667 | - |" in out
    assert "| gained | wrong -> right | 1 |" in out
    assert "| lost | right -> right | 1 |" in out
    assert first_relation.main([str(tmp_path / "missing")]) == 2
