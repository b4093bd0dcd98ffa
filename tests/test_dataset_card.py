"""The dataset card ``kgsynth filter`` writes beside a corpus (``README.md``): its YAML front
matter parses, names every column with its Parquet type and every file with its row count,
states the KG's licence (or says plainly that it is unknown) and where the rows came from, and
``datasets.load_dataset(folder)`` loads the corpus through it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.filter.card import arrow_features, kg_licence
from tests.kgfixtures import build_pipeline_inputs
from tests.test_trl_corpus import TOOLSETS, build_oracle_corpus

ROOT = Path(__file__).resolve().parents[1]


def front_matter(card: Path) -> tuple[dict, str]:
    """The card's YAML front matter, parsed, and the Markdown after it."""
    text = card.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    head, sep, body = text[4:].partition("\n---\n")
    assert sep, f"{card}: the front matter is not closed"
    return yaml.safe_load(head), body


@pytest.fixture(scope="module")
def licensed(tmp_path_factory) -> Path:
    """An oracle corpus of a KG whose source file has a SOURCE.md naming its licence."""
    root = tmp_path_factory.mktemp("card")
    (root / "SOURCE.md").write_text(
        "# movies\n\n- Licence: Creative Commons Attribution 4.0 International\n"
    )
    return build_oracle_corpus(root)


def test_front_matter_parses_and_its_features_are_the_parquet_schemas(licensed):
    from datasets import Features
    from datasets.info import DatasetInfosDict

    meta, _ = front_matter(licensed / "README.md")
    infos = DatasetInfosDict.from_dataset_card_data(meta)
    assert set(infos) == {"default", "rejected"}
    for config, name in (("default", "accepted.parquet"), ("rejected", "rejected.parquet")):
        schema = pq.read_schema(licensed / name)
        assert infos[config].features == Features.from_arrow_schema(schema), name
        assert [f["name"] for f in arrow_features(schema)] == schema.names
    assert "reject_reason" in infos["rejected"].features
    assert "reject_reason" not in infos["default"].features
    configs = {c["config_name"]: c["data_files"] for c in meta["configs"]}
    assert configs == {
        "default": [{"split": "train", "path": "accepted.parquet"}],
        "rejected": [{"split": "train", "path": "rejected.parquet"}],
    }


def test_row_counts_match_the_files(licensed):
    meta, body = front_matter(licensed / "README.md")
    rows = {name: pq.read_metadata(licensed / name).num_rows for name in meta["kgsynth"]["rows"]}
    assert meta["kgsynth"]["rows"] == rows
    assert rows["accepted.parquet"] > 0 and rows["rejected.parquet"] > 0
    splits = {i["config_name"]: i["splits"] for i in meta["dataset_info"]}
    assert splits["default"] == [{"name": "train", "num_examples": rows["accepted.parquet"]}]
    assert splits["rejected"] == [{"name": "train", "num_examples": rows["rejected.parquet"]}]
    assert f"| `accepted.parquet` | {rows['accepted.parquet']:,} |" in body


def test_load_dataset_reads_the_folder_through_the_card(licensed, tmp_path):
    import datasets

    cache = str(tmp_path / "hf")
    for config, name in (("default", "accepted.parquet"), ("rejected", "rejected.parquet")):
        ds = datasets.load_dataset(str(licensed), config, split="train", cache_dir=cache)
        table = pq.read_table(licensed / name)
        assert ds.num_rows == table.num_rows and ds.column_names == table.column_names
        assert ds[0] == table.slice(0, 1).to_pylist()[0]
    whole = datasets.load_dataset(str(licensed), cache_dir=cache)
    assert list(whole) == ["train"]  # the default config: the accepted rows alone


def test_provenance_and_licence(licensed):
    meta, body = front_matter(licensed / "README.md")
    root = licensed.parent
    manifest = yaml.safe_load((licensed / "manifest.json").read_text())
    assert meta["license"] == "cc-by-4.0" and "license_name" not in meta
    prov = meta["kgsynth"]
    assert prov["git_sha"] == manifest["git_sha"]
    assert prov["kgsynth_version"] == manifest["versions"]["kgsynth"]
    assert [i["file"] for i in prov["inputs"]] == [f"trajectories_{t}.parquet" for t in TOOLSETS]
    kb_sha = hashlib.sha256((root / "kb.txt").read_bytes()).hexdigest()
    for entry, toolset in zip(prov["inputs"], TOOLSETS, strict=True):
        assert entry["mode"] == "oracle" and entry["toolset"] == toolset
        assert entry["kg"]["name"] == "kb.txt" and entry["kg"]["source_sha256"] == kb_sha
        assert entry["kg"]["license"] == "cc-by-4.0" and entry["kg"]["license_from"] == "SOURCE.md"
        assert entry["question_llm"] == {"backend": "template", "model": "rules-v3"}
        assert entry["questions_file"] == "questions.parquet"
    accepted = pq.read_table(licensed / "accepted.parquet", columns=["generator"])
    assert sum(g["rows"] for g in prov["trajectory_generators"]) == accepted.num_rows
    assert prov["filter"]["config"] == manifest["config"]
    assert prov["filter"]["rejects"] == manifest["rejects"]
    assert "`cc-by-4.0`" in body
    # the card names files, never the folders they sit in on this machine
    assert str(root) not in (licensed / "README.md").read_text()


def test_unknown_licence_is_said_plainly_and_an_empty_reject_file_is_no_config(tmp_path):
    import datasets

    paths = build_pipeline_inputs(tmp_path, walks=6, structures="chain-1")
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
    meta, body = front_matter(corpus / "README.md")
    assert meta["license"] == "other" and meta["license_name"] == "unknown"
    assert "Unknown: kgsynth found no licence" in body and "kb.txt" in body
    assert pq.read_metadata(corpus / "rejected.parquet").num_rows == 0
    assert [c["config_name"] for c in meta["configs"]] == ["default"]
    assert meta["kgsynth"]["rows"]["rejected.parquet"] == 0
    ds = datasets.load_dataset(str(corpus), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == meta["kgsynth"]["rows"]["accepted.parquet"]
    # --overwrite takes the folder, card and all, as kgsynth's own
    res = runner.invoke(app, ["filter", "--in", str(traj), "--out", str(corpus), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in corpus.iterdir()) == [
        "README.md",
        "accepted.parquet",
        "filter_stats.png",
        "manifest.json",
        "rejected.parquet",
    ]


def test_the_shipped_metaqa_kb_is_cc_by_3():
    sources = [
        p / "kb_partial.txt.gz"
        for p in (ROOT / "kgsynth" / "resources" / "metaqa", ROOT / "data" / "metaqa")
        if (p / "kb_partial.txt.gz").is_file()
    ]
    assert sources
    assert kg_licence(str(sources[0])) == ("cc-by-3.0", "SOURCE.md")
    assert kg_licence("http://localhost:7878/query") == (None, None)
    assert kg_licence(None) == (None, None)


def test_nested_types_match_datasets_and_an_unknown_type_names_its_column():
    from datasets import Features
    from datasets.info import DatasetInfosDict

    schema = pa.schema(
        [
            ("paths", pa.list_(pa.list_(pa.string()))),
            ("spans", pa.list_(pa.struct([("start", pa.int64()), ("tags", pa.list_(pa.int8()))]))),
            ("when", pa.timestamp("us")),
            ("score", pa.float32()),
            ("blob", pa.large_binary()),
        ]
    )
    card = {"dataset_info": {"features": arrow_features(schema)}}
    parsed = DatasetInfosDict.from_dataset_card_data(card)["default"].features
    assert parsed == Features.from_arrow_schema(schema)
    bad = pa.schema([("ok", pa.string()), ("lookup", pa.map_(pa.string(), pa.int32()))])
    with pytest.raises(ValueError, match=r"column lookup: Arrow type map<string, int32>"):
        arrow_features(bad)
