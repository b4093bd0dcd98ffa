"""KnowCoder-A1's and ISP-KGR's copy drills are written in their own action spaces (issue 42
item 4): a drill's tool call is the space's oracle's first call on the drilled name
(``SearchGraphPatterns`` on a quoted name; ``<node>Name</node>``), it parses with the space's
own turn parser and runs in the space's tools; a drill's answer is boxed as the space answers;
the names drilled are the ones the space's observations show (the explored topics and every
result row), not a handful."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.protocol import NODE
from kgsynth.agent.spaces import space
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.template import TemplateLLM
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories
from kgsynth.train.drills import copy_drills, observed_names
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import generated_movie_facts, movie_ntriples

SPACES = ("knowcoder", "isp")


@pytest.fixture(scope="module")
def kg():
    return EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))


@pytest.fixture(scope="module")
def corpora(kg, tmp_path_factory):
    """Oracle corpora of 12 walks of the movie KG in each space: tool set -> conversations."""
    walks_file = tmp_path_factory.mktemp("sparql_drills") / "walks.parquet"
    run_walks(kg, WalkConfig(n=12, seed=5), walks_file)
    walks = pq.read_table(walks_file).to_pylist()
    questions, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    out = {}
    for toolset in SPACES:
        agent = AgentConfig(toolset=toolset)
        rows, _, _ = synthesize_trajectories(
            questions, TrajectoryConfig(agent=agent), graph=KGGraph(kg), llm=TemplateLLM()
        )
        assert rows
        out[toolset] = [r["messages"] for r in rows]
    return out


def _drills(corpora, toolset: str, n: int = 60):
    drills = copy_drills(corpora[toolset], n, seed=0, toolset=toolset)
    assert len(drills) == n
    return [(d[1]["content"], d[2]["content"]) for d in drills]


@pytest.mark.parametrize("toolset", SPACES)
def test_drill_calls_parse_and_run_in_the_space_and_name_the_entity(kg, corpora, toolset):
    actions = space(toolset)
    calls = [(u, r) for u, r in _drills(corpora, toolset) if u.startswith("Topic entities: ")]
    assert len(calls) == 20
    env = ToolEnvironment(KGGraph(kg), "", AgentConfig(toolset=toolset))
    for user, reply in calls:
        topic = user.removeprefix("Topic entities: ")
        turn = actions.turns.parse_turn(f"<think>t</think>\n{reply}")
        assert turn.format_error is None and turn.query is not None, reply
        if toolset == "isp":
            assert [(op.tag, op.text) for op in turn.ops] == [(NODE, topic)]
        else:
            call = actions.parse_action(turn.query)
            assert call.name == "SearchGraphPatterns"
            assert f'VALUES ?x {{ "{topic}" }}' in call.args[0] and call.args[1] == ""
        result = actions.run_turn(env, turn)  # the name resolves: the tools show its graph
        assert result.error is None, (reply, result.text)
        assert topic in result.text


@pytest.mark.parametrize("toolset", SPACES)
def test_drill_answers_are_boxed_and_read_back_as_the_names(corpora, toolset):
    turns = space(toolset).turns
    answers = [(u, r) for u, r in _drills(corpora, toolset) if r.startswith("<answer>")]
    assert len(answers) == 40
    for user, reply in answers:
        assert "\\boxed{" in reply and '["' not in reply
        turn = turns.parse_turn(f"<think>t</think>\n{reply}")
        assert turn.format_error is None, reply
        if user.startswith("Names: "):
            assert turn.answer == user.removeprefix("Names: ").split("; ")
        else:  # a result table of ?answer and ?name: the names, in order
            rows = user.removeprefix("<information>").removesuffix("</information>").split("\n")
            assert rows[0] == "?answer\t?name"
            assert turn.answer == [row.split("\t")[1] for row in rows[1:]]


@pytest.mark.parametrize("toolset", SPACES)
def test_drilled_names_are_what_the_observations_show(corpora, toolset):
    names, relations = observed_names(corpora[toolset], toolset)
    assert "?x" not in names and not any(n.startswith('"') for n in names)
    # every topic the oracle explored or searched around is shown, so it is drilled
    topics = {
        m["content"].split("Topic entities: ")[1].split("\n")[0]
        for conv in corpora[toolset]
        for m in conv
        if m["role"] == "user" and "Topic entities: " in m["content"]
    }
    single = {t for t in topics if ", " not in t}
    assert single and single <= set(names)
    # and every answer the oracle gave (read from its result rows)
    turns = space(toolset).turns
    answers = {a for conv in corpora[toolset] for a in turns.parse_turn(conv[-1]["content"]).answer}
    assert answers and answers <= set(names)
    words = {"directed_by", "starred_actors", "release_year"}
    assert words & {r.rsplit("/", 1)[-1] for r in relations}


def test_isp_reads_each_operation_of_a_step():
    seen = space("isp").observed(
        'Operation 1 (node "Kismet"):\n<relation>\n'
        'Templates of "Kismet" (entity:Kismet), most similar to the question first; ?x is the '
        "answer; a query declares the prefixes it uses:\nPREFIX entity: <http://e/>\n"
        "1. Kismet -directed_by-> ?x (1 answer): entity:Kismet relation:directed_by ?x .\n"
        "2. Kismet <-starred_actors- ?m -release_year-> ?x (at least 3 answers): ...\n"
        "</relation>\n\nOperation 2 (SPARQL):\n?answer\t?name\n"
        "William Dieterle\tWilliam Dieterle\n[... 2 more rows]"
    )
    assert seen.names == ["Kismet", "Kismet", "William Dieterle", "William Dieterle"]
    assert seen.relations == ["directed_by", "starred_actors", "release_year"]


def test_knowcoder_reads_pattern_headings_and_rows():
    seen = space("knowcoder").observed(
        "Graph patterns of ?x = Kismet <http://e/Kismet>, Juarez <http://e/Juarez> (showing 2 "
        "of 2, best match first):\n"
        '(?x, <http://r/directed_by> -> ^<http://r/directed_by>, "Juarez")\n'
        '("The \\"Big\\" Hit", <http://r/starred_actors>, ?x)'
    )
    assert seen.names == ["Kismet", "Juarez", "Juarez", 'The "Big" Hit']
    assert seen.relations == [
        "http://r/directed_by",
        "http://r/directed_by",
        "http://r/starred_actors",
    ]
