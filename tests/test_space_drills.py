"""Copy drills ask the corpus's action space what its observations show and how a drill's tool
call reads (issue 45): GraphWalker's paper-style ``[h, r, t]`` lines and KG-R1's flat lists give
drills on the triples they show; the corpora whose drills the earlier parser already read give
the same drills, byte for byte."""

from __future__ import annotations

import hashlib
import json
import random

import pyarrow.parquet as pq
import pytest

from kgsynth.agent.carried import write_agent_file
from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces import space
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.template import TemplateLLM
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories
from kgsynth.train.drills import copy_drills, corpus_toolset, observed_names
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import generated_movie_facts, movie_ntriples

# sha256 of json.dumps(copy_drills(corpus, 12, seed=0), ensure_ascii=False) for each corpus
# below, as the code before this change (commit 576322f, its sexpr case detected from the
# observations) wrote them: data from one run of that code, not a re-implementation.
# knowcoder's and isp's drills are their own spaces' since issue 42 item 4
# (tests/test_sparql_drills.py), so they are no longer the earlier code's. Since the oracle
# replays a conjunction's branches in the order the question names their topics
# (kgsynth.agent.topics) the corpora differ, and so do the digests: those of 576322f were
# 1845e734... (graphwalker) and effdd0c2... (sexpr); these are of the corpora of that change.
BEFORE = {
    "graphwalker": "824e129ee216582e563eb94e887f0070b8b2de9f3b5a9e556f5964d5899232c7",
    "sexpr": "db0d304aed6e5e37fe08f38101d371530bbdd57324d1e6d769163aecdf17402e",
}
SETTINGS = {
    "graphwalker": {},
    "graphwalker-paper": {"graphwalker_observations": "paper"},
    "kgr1": {"toolset": "kgr1"},  # the flat lists (kgr1_observation's default)
    "knowcoder": {"toolset": "knowcoder"},
    "isp": {"toolset": "isp"},
    "sexpr": {"toolset": "sexpr"},
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Oracle corpora of 40 walks of the movie KG, one per setting: (tool set, messages)."""
    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    walks_file = tmp_path_factory.mktemp("space_drills") / "walks.parquet"
    run_walks(kg, WalkConfig(n=40, seed=5), walks_file)
    walks = pq.read_table(walks_file).to_pylist()
    questions, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    out = {}
    for label, settings in SETTINGS.items():
        agent = AgentConfig(**settings)
        rows, _, _ = synthesize_trajectories(
            questions, TrajectoryConfig(agent=agent), graph=KGGraph(kg), llm=TemplateLLM()
        )
        out[label] = (agent.toolset, [r["messages"] for r in rows])
    return out


def _observed_triples(toolset: str, conversations) -> set[tuple[str, str, str]]:
    return {
        t
        for conv in conversations
        for m in conv
        if m["role"] == "tool"
        for t in space(toolset).observed(m["content"]).triples
    }


@pytest.mark.parametrize("label", ["graphwalker-paper", "kgr1"])
def test_drills_of_paper_style_corpora_drill_on_the_triples_they_show(corpora, label):
    toolset, conversations = corpora[label]
    shown = [m["content"] for conv in conversations for m in conv if m["role"] == "tool"]
    # the earlier parser read (h, r, t) lines only: these corpora gave it nothing
    assert not any(line.startswith("(") for text in shown for line in text.splitlines()[1:])
    triples = _observed_triples(toolset, conversations)
    assert len(triples) >= 20
    for h, r, t in triples:  # each read back as the observation wrote it
        written = f"[{h}, {r}, {t}]" if label == "graphwalker-paper" else f'relation "{r}"'
        assert any(written in text and h in text and t in text for text in shown)
    names = {n for h, _, t in triples for n in (h, t)}
    relations = {r for _, r, _ in triples}
    drills = copy_drills(conversations, 30, seed=0, toolset=toolset)
    assert len(drills) == 30
    replies = [d[2]["content"] for d in drills]
    copied = [
        json.loads(r[len("<answer>") : -len("</answer>")]) for r in replies if "<answer>" in r
    ]
    assert copied and all(set(c) <= names for c in copied)
    drilled = [d[1]["content"] for d in drills if d[1]["content"].startswith("<information>")]
    assert drilled and all(
        line.rsplit(", ", 2)[1] in relations
        for text in drilled
        for line in text.removeprefix("<information>").removesuffix("</information>").split("\n")
    )
    calls = [r for r in replies if r.startswith("<kg-query>")]
    tools = {"graphwalker": ("get_relations(", "get_triples("), "kgr1": ("get_tail_",)}[toolset]
    assert calls and all(c.removeprefix("<kg-query>").startswith(tools) for c in calls)
    assert any(n in c for c in calls for n in names)


@pytest.mark.parametrize("label", sorted(BEFORE))
def test_drills_of_the_default_corpora_are_what_the_earlier_code_wrote(corpora, label):
    toolset, conversations = corpora[label]
    drills = copy_drills(conversations, 12, seed=0, toolset=toolset)
    digest = hashlib.sha256(json.dumps(drills, ensure_ascii=False).encode()).hexdigest()
    assert len(drills) == 12 and digest == BEFORE[label], drills


def test_each_space_reads_its_own_observation_lines():
    paper = space("graphwalker").observed(
        "<information>[Kismet, directed_by, William Dieterle] <- both, "
        "[Juarez, directed_by, William Dieterle], [Cut Off, direc</information>"
    )
    assert paper.triples == [
        ("Kismet", "directed_by", "William Dieterle"),
        ("Juarez", "directed_by", "William Dieterle"),
    ]
    flat = space("kgr1").observed(
        'Tail entities for relation "starred_actors" with head "Kismet" (showing 2 of 5, '
        "capped): Marlene Dietrich <- both, Ronald Colman, ... (3 more)\n"
        'Head entities for relation "directed_by" with tail "William Dieterle": Juarez\n'
        'Tail relations for entity "Kismet": directed_by, release_year'
    )
    assert flat.triples == [
        ("Kismet", "starred_actors", "Marlene Dietrich"),
        ("Kismet", "starred_actors", "Ronald Colman"),
        ("Juarez", "directed_by", "William Dieterle"),
    ]
    # the entity lists' relations, then the relation list's
    relations = ["starred_actors", "starred_actors", "directed_by", "directed_by", "release_year"]
    assert flat.relations == relations
    sexpr = space("sexpr").observed("expression1 = (JOIN r Kismet)\n2 results: Juarez; Kismet")
    assert sexpr.names == ["Juarez", "Kismet"] and sexpr.triples == []
    table = space("isp").observed("?film\t?director\nKismet\tWilliam Dieterle\n[... 3 more rows]")
    assert table.names == ["Kismet", "William Dieterle"]
    # the default space (no tool set known) reads triple lines and tables, not flat lists
    assert observed_names([[{"role": "tool", "content": "(A, r, B)"}]]) == (["A", "B"], ["r"])
    assert space("graphwalker").observed("Juarez, Kismet").names == []


def test_a_space_writes_its_drill_calls():
    rng = random.Random(0)
    assert space("sexpr").drill_call("Kismet", ["directed_by"], rng) == (
        "Find_relation [ Kismet | directed_by ]"
    )
    calls = {space("kgr1").drill_call("Kismet", ["directed_by"], rng) for _ in range(20)}
    assert calls == {
        'get_tail_relations("Kismet")',
        'get_tail_entities("Kismet", "directed_by")',
    }


def test_the_corpus_toolset_comes_from_its_manifest(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "accepted.parquet").write_bytes(b"")
    assert corpus_toolset(corpus / "accepted.parquet") is None  # no manifest says
    (tmp_path / "stage1").mkdir()
    write_agent_file(tmp_path / "stage1", AgentConfig(toolset="kgr1"))
    assert corpus_toolset(corpus / "accepted.parquet", tmp_path / "stage1") == "kgr1"
