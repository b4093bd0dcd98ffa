"""The Parquet files kgsynth writes load with Hugging Face ``datasets`` as they are: the same
rows, and the nested columns (chat messages, per-turn records) as lists of dicts."""

from __future__ import annotations

import pyarrow.parquet as pq
from typer.testing import CliRunner

from kgsynth.cli import app
from tests.kgfixtures import build_pipeline_inputs


def test_corpora_load_with_hf_datasets(tmp_path):
    datasets = __import__("datasets")
    paths = build_pipeline_inputs(tmp_path, walks=12, structures="chain-1:0.6,chain-2:0.4")
    runner = CliRunner()
    traj = tmp_path / "trajectories.parquet"
    corpus = tmp_path / "corpus"
    for args in (
        ["synthesize", "trajectories", "--questions", str(paths["questions"]), "--kg",
         str(paths["store"]), "--mode", "oracle", "--llm", "template", "--out", str(traj)],
        ["filter", "--in", str(traj), "--out", str(corpus)],
    ):  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    files = [paths["walks"], paths["questions"], traj, *sorted(corpus.glob("*.parquet"))]
    loaded = 0
    for path in files:
        table = pq.read_table(path)
        if table.num_rows == 0:
            continue  # datasets has no split to make of a file without rows (no rejects)
        loaded += 1
        ds = datasets.load_dataset(
            "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf")
        )
        assert ds.num_rows == table.num_rows > 0, path
        assert ds.column_names == table.column_names, path
        assert ds[0] == table.slice(0, 1).to_pylist()[0], path
    assert loaded >= 4
    accepted = datasets.load_dataset(
        "parquet",
        data_files=str(corpus / "accepted.parquet"),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    messages = accepted[0]["messages"]
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert messages[-1]["role"] == "assistant" and "<answer>" in messages[-1]["content"]
