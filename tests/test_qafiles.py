"""Benchmark question files: MetaQA text (+ qtype), JSONL, Parquet, gzip; errors name file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kgsynth.core.errors import InputFileError
from kgsynth.datasets.qafiles import QARecord, read_question_texts, read_questions

METAQA = Path(__file__).resolve().parents[2] / "shared" / "data" / "metaqa"

LINES = [
    "what films did [Michelle Trachtenberg] star in\tInspector Gadget|Black Christmas|Ice Princess",
    "where was [Kismet] filmed\tWashington, D.C.|Paris, Texas",
    "",  # blank lines are skipped; line numbers stay those of the file
    "which movies share [Tom Hanks] and [Meg Ryan]\tSleepless in Seattle| You've Got Mail ",
]
QTYPES = ["actor_to_movie", "movie_to_director_to_movie_to_language", "actor_to_movie_to_actor"]


def write(path: Path, lines: list[str], *, gz: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def test_metaqa_text_brackets_topics_answers_and_qtype_hops(tmp_path):
    src = write(tmp_path / "qa.txt", LINES)
    qtypes = write(tmp_path / "types.txt", QTYPES)
    recs = read_questions(src, qtype_file=qtypes)
    assert recs[0] == QARecord(
        question="what films did Michelle Trachtenberg star in",
        raw_question="what films did [Michelle Trachtenberg] star in",
        topic_names=["Michelle Trachtenberg"],
        answer_names=["Inspector Gadget", "Black Christmas", "Ice Princess"],
        qtype="actor_to_movie",
        hops=1,
        line=1,
    )
    # answers split on '|' only: commas inside names survive
    assert recs[1].answer_names == ["Washington, D.C.", "Paris, Texas"]
    assert (recs[1].qtype, recs[1].hops) == ("movie_to_director_to_movie_to_language", 3)
    assert recs[2].question == "which movies share Tom Hanks and Meg Ryan"
    assert recs[2].topic_names == ["Tom Hanks", "Meg Ryan"]
    assert recs[2].answer_names == ["Sleepless in Seattle", "You've Got Mail"]
    assert (recs[2].hops, recs[2].line) == (2, 4)


def test_without_qtype_file_types_are_none(tmp_path):
    recs = read_questions(write(tmp_path / "questions.txt", LINES))
    assert [(r.qtype, r.hops) for r in recs] == [(None, None)] * 3


def test_qtype_file_found_in_the_metaqa_layout(tmp_path):
    (tmp_path / "2-hop" / "vanilla").mkdir(parents=True)
    src = write(tmp_path / "2-hop" / "vanilla" / "qa_dev.txt.gz", LINES, gz=True)
    write(tmp_path / "2-hop" / "qa_dev_qtype.txt", QTYPES)
    assert [r.hops for r in read_questions(src)] == [1, 3, 2]
    assert [r.hops for r in read_questions(src, qtype_file=False)] == [None] * 3


def test_limit_keeps_first_records_but_still_checks_qtype_count(tmp_path):
    src = write(tmp_path / "qa.txt", LINES)
    recs = read_questions(src, qtype_file=write(tmp_path / "t.txt", QTYPES), limit=2)
    assert [r.line for r in recs] == [1, 2]
    with pytest.raises(InputFileError, match=r"has 2 question types but .* has 3 questions"):
        read_questions(src, qtype_file=write(tmp_path / "t2.txt", QTYPES[:2]), limit=1)


def test_qtype_line_count_mismatch_names_both_files(tmp_path):
    src = write(tmp_path / "qa.txt", LINES)
    qtypes = write(tmp_path / "types.txt", [*QTYPES, "movie_to_year"])
    with pytest.raises(InputFileError) as info:
        read_questions(src, qtype_file=qtypes)
    msg = str(info.value)
    assert msg.startswith(f"{qtypes}: has 4 question types but {src} has 3 questions")


@pytest.mark.parametrize(
    ("bad_line", "field"),
    [
        ("no tab here [X]", "expected 2 tab-separated fields"),
        ("a [X]\tb\tc", "found 3"),
        ("\tAnswer", "field question is empty"),
        ("no topic entity here\tAnswer", "field question has no [topic entity]"),
        ("empty topic []\tAnswer", "field question has no [topic entity]"),
        ("who is [X]\tA||B", "field answers has an empty answer"),
        ("who is [X]\t ", "field answers has an empty answer"),
    ],
)
def test_malformed_metaqa_line_names_file_line_and_field(tmp_path, bad_line, field):
    src = write(tmp_path / "qa.txt", [LINES[0], bad_line])
    with pytest.raises(InputFileError) as info:
        read_questions(src)
    assert str(info.value).startswith(f"{src}:2: ")
    assert field in str(info.value)
    assert info.value.line == 2


def test_jsonl_records(tmp_path):
    rows = [
        {"question": "who directed [Kismet]", "answer_names": ["William Dieterle"]},
        {
            "question": "what did Tom Hanks star in",
            "topic_names": "Tom Hanks",
            "answer_names": ["Big", "Washington, D.C."],
            "qtype": "actor_to_movie",
        },
        {"question": "q3", "topic_names": ["A", "B"], "answer_names": [], "hops": 2},
    ]
    src = tmp_path / "q.jsonl.gz"
    write(src, [json.dumps(r) for r in rows], gz=True)
    recs = read_questions(src)
    assert (recs[0].question, recs[0].topic_names) == ("who directed Kismet", ["Kismet"])
    assert (recs[1].topic_names, recs[1].answer_names) == (
        ["Tom Hanks"],
        ["Big", "Washington, D.C."],
    )
    assert (recs[1].qtype, recs[1].hops) == ("actor_to_movie", 1)
    assert (recs[2].topic_names, recs[2].hops, recs[2].qtype, recs[2].line) == (
        ["A", "B"],
        2,
        None,
        3,
    )
    assert read_question_texts([src, src])[:2] == [
        "who directed Kismet",
        "what did Tom Hanks star in",
    ]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ('{"answer_names": ["a"]}', "field question must be a non-empty string"),
        ('{"question": "q"}', "field answer_names is missing"),
        ('{"question": "q", "answer_names": "a"}', "field answer_names must be a list of strings"),
        ('{"question": "q", "answer_names": [1]}', "field answer_names must be a list of strings"),
        ('{"question": "q", "answer_names": [], "topic_names": 3}', "field topic_names"),
        ('{"question": "q", "answer_names": [], "hops": "2"}', "field hops"),
        ('{"question": "q", "answer_names": [], "qtype": 5}', "field qtype"),
        ('["q", "a"]', "expected a JSON object"),
        ('{"question": "q",', "invalid JSON"),
    ],
)
def test_malformed_jsonl_row_names_file_line_and_field(tmp_path, row, field):
    good = json.dumps({"question": "q", "answer_names": ["a"]})
    src = write(tmp_path / "q.jsonl", [good, good, row])
    with pytest.raises(InputFileError) as info:
        read_questions(src)
    assert str(info.value).startswith(f"{src}:3: ")
    assert field in str(info.value)


def test_parquet_like_kgsynth_questions(tmp_path):
    table = pa.table(
        {
            "question_id": ["q1", "q2"],
            "question": ["Which films did Ann Smith write?", "Who directed [Juarez]?"],
            "topic_names": [["Ann Smith"], None],
            "answer_names": [["Alpha", "Beta, Gamma"], ["William Dieterle"]],
            "hops": pa.array([1, 1], pa.int32()),
        }
    )
    src = tmp_path / "questions.parquet"
    pq.write_table(table, src)
    recs = read_questions(src)
    assert recs[0].answer_names == ["Alpha", "Beta, Gamma"]
    assert (recs[0].topic_names, recs[0].hops, recs[0].line) == (["Ann Smith"], 1, 1)
    assert (recs[1].question, recs[1].topic_names) == ("Who directed Juarez?", ["Juarez"])
    assert read_questions(src, limit=1) == recs[:1]

    gz = tmp_path / "questions.parquet.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert read_questions(gz) == recs


def test_parquet_errors_name_row_and_column(tmp_path):
    src = tmp_path / "q.parquet"
    pq.write_table(pa.table({"question": ["a", None], "answer_names": [["x"], ["y"]]}), src)
    with pytest.raises(InputFileError, match=r"q\.parquet:2: field question"):
        read_questions(src)
    pq.write_table(pa.table({"question": ["a"]}), src)
    with pytest.raises(InputFileError, match=r"missing column.*answer_names"):
        read_questions(src)
    src.write_text("not parquet")
    with pytest.raises(InputFileError, match="not a readable Parquet file"):
        read_questions(src)


def test_unknown_extension_and_missing_file(tmp_path):
    csv = write(tmp_path / "q.csv", ["a,b"])
    with pytest.raises(InputFileError, match=r"unsupported question file extension \.csv.*\.jsonl"):
        read_questions(csv)
    with pytest.raises(InputFileError, match="no such file"):
        read_questions(tmp_path / "absent.txt")


@pytest.mark.skipif(not METAQA.is_dir(), reason=f"MetaQA data not found at {METAQA}")
def test_real_metaqa_dev_1hop():
    recs = read_questions(METAQA / "1-hop" / "vanilla" / "qa_dev.txt")
    assert len(recs) == 9992
    assert all(r.hops == 1 and r.qtype and "_to_" in r.qtype for r in recs)
    assert all(len(r.topic_names) == 1 and "[" not in r.question for r in recs)
    assert recs[0].qtype == (METAQA / "1-hop" / "qa_dev_qtype.txt").read_text().split("\n")[0]
    explicit = read_questions(
        METAQA / "1-hop" / "vanilla" / "qa_dev.txt",
        qtype_file=METAQA / "1-hop" / "qa_dev_qtype.txt",
        limit=5,
    )
    assert explicit == recs[:5]
    # some gold answers hold commas; they stay whole
    assert any("," in a for r in recs for a in r.answer_names)


def test_bad_bytes_name_the_line(tmp_path):
    src = tmp_path / "qa.txt"
    src.write_bytes(LINES[0].encode() + b"\nwho is [\xff]\tA\n")
    with pytest.raises(InputFileError, match=r"qa\.txt:2: not UTF-8"):
        read_questions(src)
    gz = tmp_path / "qa.txt.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(InputFileError, match="cannot read"):
        read_questions(gz)


def test_structure_and_question_id_are_read_when_present(tmp_path):
    rows = [
        {"question": "q1", "topic_names": ["A"], "answer_names": ["x"], "question_id": 17},
        {"question": "q2", "topic_names": ["A"], "answer_names": ["x"], "structure": "2I"},
    ]
    src = write(tmp_path / "q.jsonl", [json.dumps(r) for r in rows])
    recs = read_questions(src)
    assert [(r.question_id, r.structure) for r in recs] == [("17", None), (None, "2I")]
    table = pa.table(
        {
            "question_id": ["w1-q"],
            "question": ["Who directed [Juarez]?"],
            "answer_names": [["William Dieterle"]],
            "structure": ["chain-1"],
        }
    )
    pq.write_table(table, tmp_path / "q.parquet")
    (rec,) = read_questions(tmp_path / "q.parquet")
    assert (rec.question_id, rec.structure, rec.topic_names) == ("w1-q", "chain-1", ["Juarez"])
    # MetaQA text files carry neither
    (txt,) = read_questions(write(tmp_path / "qa.txt", LINES[:1]))
    assert (txt.question_id, txt.structure) == (None, None)


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"structure": 2}, "field structure"), ({"question_id": ""}, "field question_id")],
)
def test_bad_structure_or_question_id_names_the_field(tmp_path, extra, field):
    row = {"question": "q", "answer_names": ["a"], **extra}
    src = write(tmp_path / "q.jsonl", [json.dumps(row)])
    with pytest.raises(InputFileError, match=rf"q\.jsonl:1: {field}"):
        read_questions(src)


def test_pathquestion_files_are_read_with_topic_path_and_hops(tmp_path: Path) -> None:
    """PathQuestion (``question<TAB>answer(a/b/)<TAB>topic#r1#e1#…#<end>#answer``): the topic is
    the path's first element, the answers the names between the parentheses."""
    path = tmp_path / "PQ-2H.txt"
    path.write_text(
        "which nationality is anna_x 's couple ?\tunited_kingdom(united_kingdom/)\t"
        "anna_x#spouse#bob_y#nationality#united_kingdom#<end>#united_kingdom\n"
        "who are the children of carl_z 's wife ?\tdora(dora/emil/)\t"
        "carl_z#spouse#fay#children#dora#<end>#dora\n"
    )
    first, second = read_questions(path)
    assert first.topic_names == ["anna_x"] and first.answer_names == ["united_kingdom"]
    assert (first.hops, first.qtype, first.line) == (2, "spouse#nationality", 1)
    assert second.answer_names == ["dora", "emil"]
    bad = tmp_path / "bad.txt"
    bad.write_text("q ?\tx(x/)\ta#r#x#<end>#x\nq2 ?\tnothing here\ta#r#x#<end>#x\n")
    with pytest.raises(InputFileError, match=r"bad.txt:2: field answer"):
        read_questions(bad)
