"""Benchmark files in their published formats (WebQSP, CWQ, GrailQA, GraphQuestions): the
records each reader yields, errors naming file/question/field, answer matching by id and alias,
and the commands that take them (eval, RL's question reader, the contamination guard, walk
--relations-from/--seeds-from) over the Freebase-schema fixture KG (tests/fixtures/benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.config import AgentConfig
from kgsynth.cli import app
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.datasets.benchmarks import benchmark_relations, benchmark_seed_ids, read_benchmark
from kgsynth.datasets.qafiles import read_question_texts, read_questions
from kgsynth.eval.config import EvalConfig, check_records
from kgsynth.eval.subjects import evaluate
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.open import open_kg
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.base import LLM, Completion
from kgsynth.metrics import entity_id, match_predictions, score
from kgsynth.walk import WalkConfig

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"
WEBQSP = FIXTURES / "webqsp.json"
CWQ = FIXTURES / "cwq.json"
GRAILQA = FIXTURES / "grailqa.json"
GRAPHQ = FIXTURES / "graphquestions.json"
GRAPHQ_GRAIL = FIXTURES / "graphquestions_grailqa_style.json"


@pytest.fixture(scope="module")
def store(fb_small_store) -> Path:
    return fb_small_store


@pytest.fixture(scope="module")
def graph(store) -> KGGraph:
    return KGGraph(open_kg(store))


# --- readers ------------------------------------------------------------------------------


def test_webqsp_records_take_the_first_parse():
    recs = {r.question_id: r for r in read_questions(WEBQSP)}
    assert len(recs) == 6
    films = recs["WebQTest-9001"]
    assert films.source_format == "webqsp" and films.line == 1
    assert films.question == "Which movies has Jeremy Irons acted in?"
    assert (films.topic_names, films.topic_ids) == (["Jeremy Irons"], ["m.016ywr"])
    assert films.answer_names == ["Dead Ringers", "Eragon", "The Mission", "Margin Call"]
    assert films.answer_ids == ["m.03f7xg", "m.05c9zr", "m.02ll45", "m.0cc7hmk"]
    assert films.aliases == [[], [], [], []] and films.hops == 2
    assert "ns:m.016ywr ns:film.actor.film ?y ." in films.sparql and films.sexpr is None
    born = recs["WebQTest-9004"]  # AnswerType Value: the value is the name, no id
    assert (born.answer_names, born.answer_ids) == (["1948-09-19"], [None])
    # two parses: the first one's SPARQL and answers
    bettany = recs["WebQTest-9006"]
    assert bettany.answer_names == ["United Kingdom"]
    assert "people.person.nationality" in bettany.sparql


def test_cwq_records_have_aliases_and_topics_from_the_sparql():
    recs = read_questions(CWQ)
    assert [r.qtype for r in recs] == ["composition", "conjunction", "comparative", "superlative"]
    toronto = recs[0]
    assert toronto.source_format == "cwq" and toronto.question_id == "WebQTrn-9101_5b3e0c1a"
    assert (toronto.answer_names, toronto.answer_ids) == (["Toronto"], ["m.0h7h6"])
    assert toronto.aliases == [["Hogtown", "Toronto, Ontario"]]
    # CWQ names no topic entity: the SPARQL's entities, by id
    assert toronto.topic_names == [] and toronto.topic_ids == ["m.03f7xg"]
    assert recs[1].topic_ids == ["m.016ywr", "m.0h5g_"]


def test_grailqa_records_with_and_without_a_topic_entity():
    recs = read_questions(GRAILQA)
    genre, born, count = recs[0], recs[1], recs[2]
    assert genre.question_id == "9201000001000" and genre.source_format == "grailqa"
    assert (genre.topic_names, genre.topic_ids) == (["Thriller"], ["m.01jfsb"])
    assert genre.sexpr == "(AND film.film (JOIN film.film.genre m.01jfsb))"
    assert genre.qtype == "i.i.d." and genre.hops == 1 and "VALUES ?x1" in genre.sparql
    assert len(genre.answer_ids) == 5 and genre.answer_ids[0] == "m.016yxn"
    # a question about a value of a class: no topic entity, still a record
    assert born.topic_names == [] and born.topic_ids == []
    assert (born.answer_names, born.answer_ids) == (["David Cronenberg"], ["m.026fd"])
    assert "1943-03-15^^" in born.sexpr
    assert (count.answer_names, count.answer_ids) == (["4"], [None])
    assert count.sexpr.startswith("(COUNT")


def test_graphquestions_as_released_and_in_grailqa_style():
    nationality, count, birthplace = read_questions(GRAPHQ)
    assert nationality.source_format == "graphq" and nationality.question_id == "930100000000"
    assert nationality.answer_names == ["Republic of Ireland", "United States of America"]
    assert nationality.answer_ids == ["m.03rt9", "m.09c7w0"]  # answer_mid, parallel
    assert (nationality.topic_names, nationality.topic_ids) == (["Liam Neeson"], ["m.0h5g_"])
    assert nationality.qtype == "none" and nationality.sexpr is None
    assert (count.answer_names, count.answer_ids, count.qtype) == (["4"], [None], "count")
    assert birthplace.answer_ids == ["m.03dm7"]
    # the GrailQA-style conversion: told apart by its graphquestions* file name
    quinto, languages = read_questions(GRAPHQ_GRAIL)
    assert quinto.source_format == "graphq" and quinto.answer_ids == ["m.0d02km"]
    assert quinto.sexpr == "(AND people.person (JOIN people.person.place_of_birth m.068p2))"
    assert languages.answer_names == ["English Language", "Spanish Language"]
    assert read_benchmark(GRAPHQ_GRAIL, "grailqa")[0].source_format == "grailqa"


def test_format_detection_limit_gzip_and_texts(tmp_path):
    import gzip

    assert [r.source_format for r in read_questions(CWQ, limit=2)] == ["cwq", "cwq"]
    packed = tmp_path / "WebQSP.test.json.gz"
    packed.write_bytes(gzip.compress(WEBQSP.read_bytes()))
    assert [r.question_id for r in read_questions(packed)][:2] == ["WebQTest-9001", "WebQTest-9002"]
    texts = read_question_texts([GRAILQA, CWQ])
    assert len(texts) == 9 and texts[0] == "the genre thriller covers which films?"
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"text": "x"}]))
    with pytest.raises(InputFileError, match=r"other\.json: not a benchmark file kgsynth knows"):
        read_questions(other)
    with pytest.raises(InputFileError, match="unknown benchmark format 'kqa'"):
        read_questions(WEBQSP, format="kqa")


def _mutated(tmp_path: Path, src: Path, change) -> Path:
    data = json.loads(src.read_text())
    change(data)
    out = tmp_path / src.name
    out.write_text(json.dumps(data))
    return out


def _set(obj, keys, value):
    for k in keys[:-1]:
        obj = obj[k]
    if value is KeyError:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value


BAD = [
    (
        WEBQSP,
        ["Questions", 1, "Parses", 0, "Answers", 0, "AnswerArgument"],
        None,
        r"question 2 \(QuestionId 'WebQTest-9002'\): field Parses\[0\]\.Answers\[0\]\.AnswerArgument is null",
    ),
    (
        WEBQSP,
        ["Questions", 0, "Parses", 0, "Answers", 2, "AnswerType"],
        "Thing",
        r"question 1 \(QuestionId 'WebQTest-9001'\): field Parses\[0\]\.Answers\[2\]\.AnswerType "
        r"must be Entity or Value, got 'Thing'",
    ),
    (WEBQSP, ["Questions"], {"a": 1}, r'a WebQSP file is an object with a "Questions" list'),
    (
        CWQ,
        [2, "answers", 1, "aliases"],
        [3],
        r"question 3 \(ID 'WebQTrn-9103_0c4d11e2'\): field answers\[1\]\.aliases must be a list of strings",
    ),
    (
        CWQ,
        [0, "question"],
        KeyError,
        r"question 1 \(ID 'WebQTrn-9101_5b3e0c1a'\): field question is missing",
    ),
    (
        GRAILQA,
        [3, "answer", 0, "answer_argument"],
        KeyError,
        r"question 4 \(qid 9201000004000\): field answer\[0\]\.answer_argument is missing",
    ),
    (
        GRAILQA,
        [0, "graph_query", "nodes", 1, "id"],
        7,
        r"question 1 \(qid 9201000001000\): field graph_query\.nodes\[1\]\.id must be a string, got 7",
    ),
    (
        GRAILQA,
        [4, "answer"],
        "Eastern Promises",
        r"question 5 \(qid 9201000005000\): field answer must be a list",
    ),
    (
        GRAPHQ,
        [0, "answer_mid"],
        ["m.03rt9"],
        r"question 1 \(qid 930100000000\): field answer_mid must list one id string per answer \(2\)",
    ),
]


@pytest.mark.parametrize(("src", "keys", "value", "message"), BAD)
def test_bad_fields_name_file_question_and_field(tmp_path, src, keys, value, message):
    path = _mutated(tmp_path, src, lambda d: _set(d, keys, value))
    with pytest.raises(InputFileError, match=message) as info:
        read_questions(path)
    assert str(info.value).startswith(f"{path}: ")


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "grailqa_dev.json"
    path.write_text('[\n  {"qid": 1,\n   "question": "x",,\n}]')
    with pytest.raises(InputFileError, match=r"grailqa_dev\.json:3: invalid JSON"):
        read_questions(path)


# --- answer matching ----------------------------------------------------------------------


def test_entity_ids_in_every_spelling():
    for text in ("m.0h7h6", "ns:m.0h7h6", "/m/0h7h6", "http://rdf.freebase.com/ns/m.0h7h6"):
        assert entity_id(text) == "m.0h7h6"
    assert entity_id("<http://rdf.freebase.com/ns/g.11b6d2>") == "g.11b6d2"
    assert entity_id("http://www.wikidata.org/entity/Q42") == entity_id("wd:Q42") == "Q42"
    for text in ("Toronto", "1948-09-19", "Q0", "m.", "M.0H7H6", "http://x.org/m.0h7h6"):
        assert entity_id(text) is None


def test_ids_match_ids_and_names_match_names_or_aliases():
    (toronto,) = read_benchmark(CWQ, limit=1)
    gold, ids, aliases = toronto.answer_names, toronto.answer_ids, toronto.aliases

    def hit(pred):
        return score(pred, gold, gold_ids=ids, aliases=aliases).hit

    assert hit(["m.0h7h6"]) == hit(["http://rdf.freebase.com/ns/m.0h7h6"]) == 1.0
    assert hit(["hogtown"]) == hit(["Toronto, Ontario"]) == hit(["the toronto"]) == 1.0
    assert hit(["m.0h7h7"]) == 0.0  # an id matches ids only, never a name
    assert hit(["Ontario"]) == 0.0
    # several predictions naming one answer count once: the set {Toronto}
    s = score(["m.0h7h6", "Hogtown"], gold, gold_ids=ids, aliases=aliases)
    assert (s.em_strict, s.precision, s.f1) == (1.0, 1.0, 1.0)
    # a gold name wins over another answer's alias
    assert match_predictions(["B"], ["A", "B"], aliases=[["B"], []]) == ["B"]
    # a value answer has no id: it is matched by its text
    (born,) = [r for r in read_benchmark(WEBQSP) if r.question_id == "WebQTest-9004"]
    assert score(["1948-09-19"], born.answer_names, gold_ids=born.answer_ids).hit == 1.0


def test_metaqa_scoring_is_unchanged_without_ids():
    pred, gold = ["the Matrix", "m.0abc"], ["Matrix", "Speed"]
    assert match_predictions(pred, gold) == pred
    assert score(pred, gold) == score(pred, gold, gold_ids=[], aliases=[])
    assert score(pred, gold).f1 == pytest.approx(0.5)


# --- eval, RL, contamination guard ---------------------------------------------------------


class AnswerPolicy(LLM):
    """Answers each question at once with a fixed answer; keeps the prompts it was sent."""

    backend = "scripted"
    model = "script"

    def __init__(self, answers: dict[str, list[str]]) -> None:
        super().__init__()
        self.answers = answers
        self.prompts: dict[str, str] = {}

    def generate_batch(self, requests, progress=None):
        out = []
        for i, r in enumerate(requests):
            user = r.message_dicts()[1]["content"]
            question = user.split("\n")[0].removeprefix("Question: ")
            self.prompts[question] = user
            answer = json.dumps(self.answers[question])
            c = Completion(f"<think>x</think><answer>{answer}</answer>", completion_tokens=3)
            self.stats.add(c)
            out.append(c)
            if progress:
                progress(i, c)
        return out


def test_eval_scores_benchmark_answers_by_id_and_alias(graph):
    cwq = read_questions(CWQ, limit=2)
    grail_no_topic = read_questions(GRAILQA)[1]
    check_records([*cwq, grail_no_topic], CWQ)  # no topic entity: valid for a benchmark
    policy = AnswerPolicy(
        {
            cwq[0].question: ["m.0h7h6"],
            cwq[1].question: ["mission"],  # CWQ's alias "Mission"
            grail_no_topic.question: ["David Cronenberg"],
        }
    )
    rows, metrics = evaluate(
        [*cwq, grail_no_topic], policy, graph, EvalConfig(agent=AgentConfig(max_turns=2))
    )
    assert [r["hit"] for r in rows] == [1.0, 1.0, 1.0]
    assert metrics["majority"]["hit"] == 1.0 and metrics["union"]["em_strict"] == 1.0
    # CWQ gives its topics by id: the agent is told their names from the KG
    assert policy.prompts[cwq[0].question].endswith("Topic entities: Dead Ringers")
    assert policy.prompts[cwq[1].question].endswith("Topic entities: Jeremy Irons, Liam Neeson")
    assert policy.prompts[grail_no_topic.question].endswith(
        "Topic entities: none given (find them in the question)"
    )
    assert rows[0]["question_id"] == "WebQTrn-9101_5b3e0c1a"


def test_eval_cli_reads_a_webqsp_file(tmp_path, store):
    """`kgsynth eval` on the WebQSP fixture with a tiny untrained model and the no-tools
    baseline, whose prompt names no domain."""
    import torch

    from kgsynth.agent.loop import system_prompt
    from kgsynth.eval.episodes import NO_TOOLS_SYSTEM_PROMPT
    from kgsynth.train.tiny import build_tiny_model

    assert "movie" not in NO_TOOLS_SYSTEM_PROMPT
    model = build_tiny_model(
        [system_prompt(), "Which movies has Jeremy Irons acted in?"], tmp_path / "m", vocab_size=300
    )
    out = tmp_path / "eval"
    args = ["eval", "--questions", str(WEBQSP), "--kg", str(store), "--model", str(model)]
    args += ["--out", str(out), "--max-turns", "1", "--max-turn-tokens", "4", "--limit", "2"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = CliRunner().invoke(app, [*args, "--baseline", "no-tools"])
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out / "predictions.parquet").to_pylist()
    assert {r["system"] for r in rows} == {"model", "no-tools"}
    assert [r["question_id"] for r in rows if r["system"] == "model"] == [
        "WebQTest-9001",
        "WebQTest-9002",
    ]
    assert rows[0]["gold"] == ["Dead Ringers", "Eragon", "The Mission", "Margin Call"]
    no_tools = next(r for r in rows if r["system"] == "no-tools")
    assert no_tools["messages"][0]["content"] == NO_TOOLS_SYSTEM_PROMPT
    assert json.loads((out / "metrics.json").read_text())["counts"]["questions"] == 2


def test_rl_reads_benchmark_questions_and_names_id_only_topics(graph, tmp_path):
    from kgsynth.train.grpo_run import read_rl_questions, with_topic_names

    qs = read_rl_questions(CWQ)
    assert qs[1].topic_names == [] and qs[1].topic_ids == ("m.016ywr", "m.0h5g_")
    named = with_topic_names(qs, graph)
    assert named[1].topic_names == ["Jeremy Irons", "Liam Neeson"]
    assert named[1].answers == ["The Mission"] and named[1].question_id == "cwq.json:2"
    grail = read_rl_questions(GRAILQA)
    assert grail[1].topic_names == [] and grail[1].answers == ["David Cronenberg"]


def test_contamination_guard_reads_a_grailqa_file():
    from kgsynth.datasets.contamination import benchmark_guard, flag

    similarity, n = benchmark_guard([GRAILQA])
    assert n == 5
    sims = similarity(["which films belong to the thriller genre?", "how tall is mount everest?"])
    assert flag(sims, 0.8) == [True, False]


# --- walk --relations-from / --seeds-from -----------------------------------------------------


def test_p_and_e_from_benchmark_sparql():
    name = get_profile("freebase").relation_name
    assert benchmark_relations(WEBQSP, name) == [
        "film.actor.film",
        "film.actor.film.film.performance.film",  # the CVT hop, flattened
        "film.director.film",
        "film.film.genre",
        "film.film.initial_release_date",
        "film.performance.film",
        "people.person.date_of_birth",
        "people.person.nationality",
        "people.person.place_of_birth",
    ]
    assert benchmark_seed_ids(WEBQSP) == ["m.016ywr", "m.03f7xg", "m.026fd", "m.01chc7"]
    assert benchmark_seed_ids(GRAILQA) == ["m.01jfsb", "m.026fd", "m.0h5g_"]
    with pytest.raises(ConfigError, match="--relations or --relations-from"):
        WalkConfig(relations="r.txt", relations_from=str(WEBQSP))
    with pytest.raises(ConfigError, match="--seeds or --seeds-from"):
        WalkConfig(seeds="s.txt", seeds_from=str(WEBQSP))


def test_walks_keep_to_the_benchmark_relations_and_seeds(tmp_path, store):
    out = tmp_path / "walks.parquet"
    args = ["walk", "--kg", str(store), "--out", str(out), "--n", "10"]
    args += ["--structures", "chain-1:1,chain-2:1", "--relations-from", str(WEBQSP)]
    res = CliRunner().invoke(app, [*args, "--seeds-from", str(GRAILQA)])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 10
    allowed = set(benchmark_relations(WEBQSP, get_profile("freebase").relation_name))
    seeds = {"http://rdf.freebase.com/ns/" + i for i in benchmark_seed_ids(GRAILQA)}
    used = {h["relation"] for r in rows for b in r["branches"] for h in b}
    assert used <= allowed and "film.director.film" in used
    assert {t for r in rows for t in r["topic_ids"]} <= seeds
    manifest = json.loads((tmp_path / "walks.manifest.json").read_text())
    assert manifest["config"]["relations_from"] == str(WEBQSP)
    # a benchmark whose relations the KG lacks altogether is an error naming the file
    foreign = tmp_path / "foreign.json"
    data = json.loads(CWQ.read_text())[:1]
    data[0]["sparql"] = (
        data[0]["sparql"]
        .replace("film.director.film", "x.y.z")
        .replace("people.person.place_of_birth", "x.y.w")
    )
    foreign.write_text(json.dumps(data))
    res = CliRunner().invoke(
        app,
        [
            "walk",
            "--kg",
            str(store),
            "--out",
            str(tmp_path / "w2.parquet"),
            "--relations-from",
            str(foreign),
        ],
    )
    assert res.exit_code == 3 and "none of the 2 relations its gold SPARQL uses" in res.output


def test_fixture_kg_is_rebuilt_from_fb15k237():
    """fb_small.nt is what its builder writes from FB15k-237 (when the shared data is here)."""
    import subprocess
    import sys

    source = Path(__file__).resolve().parents[2] / "shared" / "data" / "fb15k237"
    if not (source / "derived" / "train.tsv.gz").is_file():
        pytest.skip("FB15k-237 is not in ../shared/data")
    made = subprocess.run(
        [sys.executable, str(FIXTURES / "build_fb_small.py")], capture_output=True, check=True
    )
    assert made.stdout == (FIXTURES / "fb_small.nt").read_bytes()
