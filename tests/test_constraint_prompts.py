"""The LLM backends' question and judge prompts for constraint walks (issue 18) state what the
walk's S-expression asks of its set, so an openai/hf model writes a count, superlative,
comparative or time question, not a chain question."""

import pytest

from kgsynth.synthesize.questions import judge_messages, question_messages

E = "<http://kgsynth.org/entity/William%20Dieterle>"


def _row(structure: str, sexpr: str, answers: list[str]) -> dict:
    return {
        "structure": structure,
        "topic_names": ["William Dieterle"],
        "branches": [[{"relation": "directed_by", "inverse": True, "entity": "Kismet"}]],
        "merge_at": [1],
        "answer_names": answers,
        "sexpr": sexpr,
    }


@pytest.mark.parametrize(
    ("structure", "sexpr", "answers", "said"),
    [
        ("count", f"(COUNT (JOIN directed_by {E}))", ["2"], "count the entities of the set"),
        (
            "superlative",
            f"(ARGMAX (JOIN directed_by {E}) release_year)",
            ["Kismet"],
            "the largest release year",
        ),
        (
            "comparative",
            f"(AND (JOIN directed_by {E}) (gt release_year 1940))",
            ["Kismet"],
            "release year is after 1940",
        ),
        ("time", f"(TC (JOIN directed_by {E}) release_year 1944)", ["Kismet"], "falls in 1944"),
    ],
)
def test_constraint_prompts_state_the_operation(structure, sexpr, answers, said):
    row = _row(structure, sexpr, answers)
    [message] = question_messages(row)
    assert said in message["content"]
    assert "William Dieterle" in message["content"]
    assert "Kismet" not in message["content"].split("Answer(s):")[0]  # the walked film is hidden
    [judge] = judge_messages(row, "How many films did William Dieterle direct?")
    assert said in judge["content"]


def test_chain_walks_keep_the_path_prompt():
    row = _row("chain-1", "", ["Kismet", "Juarez"])
    [message] = question_messages(row)
    assert "over that whole set" not in message["content"]
    assert "follows 1 relation(s) to the answer" in message["content"]
