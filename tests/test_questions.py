"""`kgsynth synthesize questions`: masking, parsing, leakage, judge and contamination filters."""

from collections.abc import Sequence

import pyarrow.parquet as pq
import pytest

from kgsynth.llm.base import LLM, Completion, Request
from kgsynth.llm.template import TemplateLLM, question_from_walk
from kgsynth.synthesize.questions import (
    QuestionConfig,
    leakage_reason,
    masked_paths,
    parse_question,
    parse_scores,
    question_messages,
    synthesize_questions,
)

CHAIN = {
    "walk_id": "w-1",
    "structure": "chain-2",
    "hops": 2,
    "topic_names": ["Bette Davis"],
    "topic_ids": ["e:bd"],
    "branches": [
        [
            {"relation": "starred_actors", "inverse": True, "entity": "Juarez"},
            {"relation": "directed_by", "inverse": False, "entity": "William Dieterle"},
        ]
    ],
    "merge_at": [2],
    "answer_names": ["William Dieterle", "William Wyler"],
    "answer_ids": ["e:wd", "e:ww"],
    "sparql": "SELECT …",
}
IP = {
    "walk_id": "w-2",
    "structure": "IP",
    "hops": 3,
    "topic_names": ["Last Orders", "Barbarosa"],
    "topic_ids": ["e:lo", "e:b"],
    "branches": [
        [
            {"relation": "written_by", "inverse": False, "entity": "Fred Schepisi"},
            {"relation": "written_by", "inverse": True, "entity": "The Devil's Playground"},
        ],
        [{"relation": "directed_by", "inverse": False, "entity": "Fred Schepisi"}],
    ],
    "merge_at": [1, 1],
    "answer_names": ["The Devil's Playground"],
    "answer_ids": ["e:dp"],
    "sparql": "SELECT …",
}


class ScriptedLLM(LLM):
    """Answers from a list of texts, in order (stands in for a model's raw output)."""

    backend = "scripted"
    model = "script"

    def __init__(self, texts: Sequence[str]) -> None:
        super().__init__()
        self.texts = list(texts)
        self.seen: list[Request] = []

    def generate_batch(self, requests, progress=None):
        out = []
        for i, r in enumerate(requests):
            self.seen.append(r)
            c = Completion(self.texts.pop(0))
            out.append(c)
            if progress:
                progress(i, c)
        return out


def test_intermediates_are_masked_in_the_prompt():
    text = question_messages(CHAIN)[0]["content"]
    assert "Juarez" not in text and "entity1 --starred_actors--> Bette Davis" in text
    assert "entity1 --directed_by--> William Dieterle, William Wyler" in text
    lines, tail, masked = masked_paths(IP)
    assert lines == [["Last Orders --written_by--> target"], ["Barbarosa --directed_by--> target"]]
    assert tail == ["answer --written_by--> target"] and masked == ["Fred Schepisi"]
    assert "Fred Schepisi" not in question_messages(IP)[0]["content"]


@pytest.mark.parametrize(
    ("raw", "question", "reason"),
    [
        (
            "<question>Who directed films with Bette Davis?</question>",
            "Who directed films with Bette Davis?",
            None,
        ),
        (
            "Sure! Here it is:\n<question>\n  Who directed  films with Bette Davis?\n</question>\nHope it helps",
            "Who directed films with Bette Davis?",
            None,
        ),
        ("", None, "parse_no_question_tag"),
        ("Who directed films with Bette Davis?", None, "parse_no_question_tag"),
        ("<question></question>", None, "parse_empty_question"),
        ("<question>Who? Why?</question>", None, "parse_question_mark"),
        ("<question>No question mark.</question>", None, "parse_question_mark"),
        ("<question>A?</question><question>B?</question>", None, "parse_several_questions"),
        ("<question>" + "x" * 400 + "?</question>", None, "parse_too_long"),
        ("\x00\x01 garbage ��", None, "parse_no_question_tag"),
    ],
)
def test_parse_question(raw, question, reason):
    assert parse_question(raw, 300) == (question, reason)


@pytest.mark.parametrize(
    ("question", "reason"),
    [
        ("Who directed the movies Bette Davis starred in?", None),
        ("Who directed the movies BETTE  DAVIS starred in?", None),
        ("Who directed the movies she starred in?", "leak_missing_topic"),
        ("Did William Wyler direct a Bette Davis film?", "leak_answer"),
        ("Who directed Juarez, starring Bette Davis?", "leak_intermediate"),
        ("Who directed the Bette Davis movies of Williams?", None),  # whole words only
    ],
)
def test_leakage(question, reason):
    _, _, masked = masked_paths(CHAIN)
    assert leakage_reason(question, CHAIN, masked) == reason


@pytest.mark.parametrize(
    ("raw", "scores"),
    [
        (
            '<scores>{"path_quality": 9, "relevance": 10, "coherence": 9.5}</scores>',
            {"path_quality": 9.0, "relevance": 10.0, "coherence": 9.5},
        ),
        (
            'Scores: {"path_quality": 1, "relevance": 2, "coherence": 3}',
            {"path_quality": 1.0, "relevance": 2.0, "coherence": 3.0},
        ),
        ('<scores>{"path_quality": 11, "relevance": 2, "coherence": 3}</scores>', None),
        ('<scores>{"path_quality": 9, "relevance": 9}</scores>', None),
        ('<scores>{"path_quality": "high", "relevance": 9, "coherence": 9}</scores>', None),
        ("", None),
        ("garbage {", None),
    ],
)
def test_parse_scores(raw, scores):
    assert parse_scores(raw) == scores


def test_judge_filter_and_raw_output_kept():
    good = "<question>Who directed the movies Bette Davis starred in?</question>"
    llm = ScriptedLLM(
        [
            good,
            "no tags at all",
            good,  # questions for three walks
            '<scores>{"path_quality": 9, "relevance": 10, "coherence": 9}</scores>',  # judge 1: kept
            '<scores>{"path_quality": 9, "relevance": 7, "coherence": 9}</scores>',  # judge 2: low
        ]
    )
    walks = [dict(CHAIN, walk_id=f"w-{i}") for i in range(3)]
    accepted, rejected, stats = synthesize_questions(walks, QuestionConfig(), llm=llm)
    assert [r["walk_id"] for r in accepted] == ["w-0"]
    assert accepted[0]["quality"] == {"path_quality": 9.0, "relevance": 10.0, "coherence": 9.0}
    assert {r["walk_id"]: r["reject_reason"] for r in rejected} == {
        "w-1": "parse_no_question_tag",
        "w-2": "low_quality",
    }
    assert next(r for r in rejected if r["walk_id"] == "w-1")["raw_output"] == "no tags at all"
    assert stats["rejects"] == {"parse_no_question_tag": 1, "low_quality": 1}
    assert (
        accepted[0]["question_id"].startswith("q-")
        and accepted[0]["answer_names"] == CHAIN["answer_names"]
    )


def test_contamination_drops_similar_questions():
    llm = ScriptedLLM(["<question>Who directed the movies Bette Davis starred in?</question>"] * 2)
    walks = [dict(CHAIN, walk_id="w-a"), dict(CHAIN, walk_id="w-b")]
    sims = iter([[0.95, 0.5]])
    accepted, rejected, stats = synthesize_questions(
        walks, QuestionConfig(judge=False), llm=llm, max_similarity=lambda texts: next(sims)
    )
    assert [r["walk_id"] for r in accepted] == ["w-b"] and rejected[0][
        "reject_reason"
    ] == "contamination"
    assert stats["contamination"] == {">=0.80": 1, ">=0.85": 1, ">=0.90": 1, "checked": 2}


def test_template_backend_questions_pass_their_own_checks():
    q = question_from_walk(CHAIN)
    assert (
        q == "What is the one the things whose starred actors include Bette Davis was directed by?"
    )
    accepted, rejected, stats = synthesize_questions(
        [CHAIN, IP], QuestionConfig(), llm=TemplateLLM()
    )
    assert len(accepted) == 2 and not rejected
    assert stats["quality_filter"].startswith("skipped (template backend")
    assert all(r["quality"] is None for r in accepted)


def test_cli_end_to_end_with_cache(tmp_path):
    from typer.testing import CliRunner

    from kgsynth.cli import app
    from kgsynth.kg.embedded import EmbeddedKG
    from kgsynth.kg.profiles import get_profile
    from kgsynth.walk import WalkConfig, run_walks
    from tests.kgfixtures import generated_movie_facts, movie_ntriples

    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    run_walks(kg, WalkConfig(n=40, seed=1), tmp_path / "walks.parquet")
    args = [
        "synthesize",
        "questions",
        "--walks",
        str(tmp_path / "walks.parquet"),
        "--out",
        str(tmp_path / "q" / "questions.parquet"),
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    refused = CliRunner().invoke(app, args)  # the output exists: not replaced unless asked
    assert refused.exit_code == 2 and "--overwrite" in refused.output
    second = CliRunner().invoke(app, [*args, "--overwrite"])
    assert second.exit_code == 0, second.output
    import json

    manifest = json.loads((tmp_path / "q" / "questions.manifest.json").read_text())
    assert (
        manifest["llm"]["stats"]["cache_hits"] == 40
        and manifest["llm"]["stats"]["cache_misses"] == 0
    )
    assert manifest["made_by_templates"] is True and manifest["walks"] == 40
    acc = pq.read_table(tmp_path / "q" / "questions.parquet").num_rows
    rej = pq.read_table(tmp_path / "q" / "questions.rejected.parquet").num_rows
    assert acc + rej == 40 and acc == manifest["accepted"]


def test_cli_rejects_missing_walks(tmp_path):
    from typer.testing import CliRunner

    from kgsynth.cli import app

    res = CliRunner().invoke(
        app,
        [
            "synthesize",
            "questions",
            "--walks",
            str(tmp_path / "nope.parquet"),
            "--out",
            str(tmp_path / "q.parquet"),
        ],
    )
    assert res.exit_code == 3 and "run `kgsynth walk` first" in res.output
