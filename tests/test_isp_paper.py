"""ISP-KGR as its paper gives it (issue 42): the progress reward of Alg. 2 and App. F.8, the
tree rollouts' tree-wide pruning (App. F.5, Alg. 1), the easy -> medium -> hard question
curriculum (§5.1, App. E.1), the cold start's progressive/compositional decomposition (App.
E.2) and the turn format of Figure 8, on the movie fixture KG through the real isp tools."""

from __future__ import annotations

import re

import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.loop import Episode, EpisodeTask, step
from kgsynth.agent.rewards import Gold, GraphDistance, distance_progress
from kgsynth.agent.spaces.isp.progress import strip_count
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.core.errors import ConfigError
from kgsynth.kg.graph import KGGraph
from tests.kgfixtures import E, R, movie_kg

ISP = AgentConfig(toolset="isp")
DIRECTORS = Gold(
    answers=["William Dieterle", "William Wyler"],
    question="Who directed the movies Bette Davis starred in?",
    topic_names=["Bette Davis"],
)
BETTE = f"<{E}Bette%20Davis>"
RELATIONS = ("starred_actors", "directed_by", "has_genre", "release_year")
STARRED, DIRECTED, GENRE, YEAR = (f"<{R}{r}>" for r in RELATIONS)


@pytest.fixture(scope="module")
def graph() -> KGGraph:
    return KGGraph(movie_kg())


def isp_run(graph: KGGraph, gold: Gold, steps: list[str]) -> Episode:
    """Each step ``<think>…</think>`` + ``steps[i]`` run through the real isp environment."""
    ep = Episode(EpisodeTask(gold.question, list(gold.topic_names)))
    env = ToolEnvironment(graph, gold.question, ISP)
    for text in steps:
        step(ep, env, f"<think>t</think>\n{text}", None, final=False)
    return ep


def sparql(body: str, head: str = "SELECT DISTINCT ?x") -> str:
    return f"<SPARQL>{head} WHERE {{ {body} }}</SPARQL>"


FILMS = f"?x {STARRED} {BETTE} ."


# --- 1. the progress reward: Alg. 2, App. F.8 ---------------------------------------------------


def test_progress_compares_with_the_step_before_and_scores_unknown_nodes_minus_one(graph):
    ep = isp_run(
        graph,
        DIRECTORS,
        [
            "<node>Bette Davis</node>",  # a mentioned entity: 0 (d_prev = 2)
            sparql(FILMS),  # Jezebel, Juarez: 1 < 2: +1
            sparql(f"?f {STARRED} {BETTE} . ?f {GENRE} ?x ."),  # Drama: 2, not < 1: 0
            sparql(FILMS, "SELECT ?x"),  # the films again (a new query): 1 < 2: +1
            sparql(FILMS, "SELECT ?x"),  # the same query again: -1
            "<node>Kismet</node>",  # neither mentioned nor returned: -1
            "<node>Jezebel</node>",  # returned by a query before: 0
            "\\boxed{William Wyler}",
        ],
    )
    assert [t.tool_error for t in ep.turns[:7]] == [None] * 7
    paper = GraphDistance(graph, progress="previous")
    assert distance_progress(ep, DIRECTORS, paper) == [0, 1, 0, 1, -1, -1, 0, 0]
    # kgsynth's earlier rule, kept as --progress-rule best: against the best so far (the films
    # again are no progress), and an exploration is never -1
    best = GraphDistance(graph, progress="best")
    assert distance_progress(ep, DIRECTORS, best) == [0, 1, 0, 0, -1, 0, 0, 0]


def test_progress_scores_a_query_without_rows_and_an_unrun_query_minus_one(graph):
    ep = isp_run(graph, DIRECTORS, [sparql(f"?x {DIRECTED} {BETTE} ."), "<SPARQL></SPARQL>"])
    assert ep.turns[0].observation == "no rows" and ep.turns[1].format_error is not None
    assert distance_progress(ep, DIRECTORS, GraphDistance(graph, progress="previous")) == [-1, -1]


COUNT_GOLD = Gold(
    answers=["2"],
    question="How many films did Bette Davis star in?",
    topic_names=["Bette Davis"],
    sparql=f"SELECT (COUNT(DISTINCT ?f) AS ?n) WHERE {{ ?f {STARRED} {BETTE} . }}",
)


def test_count_questions_are_scored_on_the_counted_entities(graph):
    # App. F.8: the COUNT is taken off and the entities the query retrieves are scored
    right = f"?f {STARRED} {BETTE} ."
    wrong = f"?m {STARRED} {BETTE} . ?m {DIRECTED} ?f ."  # also 2 rows: the two directors
    count = "SELECT (COUNT(DISTINCT ?f) AS ?c)"
    paper = GraphDistance(graph, progress="previous")
    ok = isp_run(graph, COUNT_GOLD, ["<node>Bette Davis</node>", sparql(right, count)])
    bad = isp_run(graph, COUNT_GOLD, ["<node>Bette Davis</node>", sparql(wrong, count)])
    assert distance_progress(ok, COUNT_GOLD, paper) == [0, 1]  # the films: 0 hops
    assert distance_progress(bad, COUNT_GOLD, paper) == [0, 0]  # the directors: 1 hop
    # the best-so-far rule reads the number "2" itself, the same for both
    best = GraphDistance(graph, progress="best")
    assert distance_progress(bad, COUNT_GOLD, best) == distance_progress(ok, COUNT_GOLD, best)


def test_strip_count():
    assert strip_count("SELECT (COUNT(DISTINCT ?f) AS ?n) WHERE { ?f ?p ?o }") == (
        "SELECT DISTINCT ?f WHERE { ?f ?p ?o }"
    )
    assert strip_count("select (count(*) as ?n) where { ?s ?p ?o }") == (
        "SELECT DISTINCT * where { ?s ?p ?o }"
    )
    with pytest.raises(ValueError, match="no COUNT"):
        strip_count("SELECT ?x WHERE { ?x ?p ?o }")


SUPERLATIVE_GOLD = Gold(
    answers=["Jezebel"],
    question="Which Bette Davis film came out first?",
    topic_names=["Bette Davis"],
    sparql=f"SELECT ?x WHERE {{ ?x {STARRED} {BETTE} . ?x {YEAR} ?y }} ORDER BY ?y LIMIT 1",
)


def test_superlative_candidates_are_one_step_from_the_answer(graph):
    # App. F.8: the candidate set without the constraint is d = 1, the constrained answer 0
    ep = isp_run(
        graph,
        SUPERLATIVE_GOLD,
        [
            "<node>Bette Davis</node>",  # 1 hop from Jezebel
            sparql(FILMS),  # Jezebel and Juarez: the candidates, d = 1: 0
            sparql(f"{FILMS} ?x {YEAR} ?y .", "SELECT ?x"),  # the candidates again: 0
        ],
    )
    ep2 = isp_run(
        graph,
        SUPERLATIVE_GOLD,
        ["<node>Bette Davis</node>", sparql(FILMS), _first_film()],
    )
    paper = GraphDistance(graph, progress="previous")
    assert distance_progress(ep2, SUPERLATIVE_GOLD, paper) == [0, 0, 1]
    assert distance_progress(ep, SUPERLATIVE_GOLD, paper) == [0, 0, 0]
    # without App. F.8 the candidates already hold the answer: progress at once
    best = GraphDistance(graph, progress="best")
    assert distance_progress(ep2, SUPERLATIVE_GOLD, best) == [0, 1, 0]


def _first_film() -> str:
    return f"<SPARQL>SELECT ?x WHERE {{ {FILMS} ?x {YEAR} ?y }} ORDER BY ?y LIMIT 1</SPARQL>"


def test_progress_rule_is_checked(graph):
    with pytest.raises(ConfigError, match="progress rule must be one of previous, best"):
        GraphDistance(graph, progress="max")


# --- 2. tree rollouts: one state cache per tree, every failure kept (App. F.5, Alg. 1) -------

KISMET_DIRECTOR = f"SELECT ?x WHERE {{ <{E}Kismet> <{R}directed_by> ?x }}"
NO_ROWS = f"SELECT ?x WHERE {{ ?x <{R}directed_by> {BETTE} }}"
BAD = "no action at all"
TREE_SCRIPT = [
    [  # from the root: explore Kismet; its director; a query with no rows
        "<think>a</think><node>Kismet</node>",
        f"<think>b</think><SPARQL>{KISMET_DIRECTOR}</SPARQL>",
        f"<think>c</think><SPARQL>{NO_ROWS}</SPARQL>",
    ],
    [  # under the exploration: the director again (another parent's observation); failures
        f"<think>d</think><SPARQL>{KISMET_DIRECTOR}</SPARQL>",
        BAD,
        BAD,
        BAD,
    ],
]


def _tree(graph: KGGraph, path: str, prune: str):
    """The tree of :data:`TREE_SCRIPT` (each sample the script's text, one list per step)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.agent.rollout import RolloutConfig, TokenPolicy
    from kgsynth.agent.tree import run_tree_rollouts

    torch.set_num_threads(1)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    policy = TokenPolicy(model, tok)
    calls = {"n": 0}

    def sample(batch, *, max_new_tokens, temperature, top_p):
        texts = TREE_SCRIPT[min(calls["n"], len(TREE_SCRIPT) - 1)]
        calls["n"] += 1
        ids = [policy.encode(texts[i % len(texts)]) for i in range(len(batch))]
        return [(new, [0.0] * len(new), False) for new in ids]

    policy.sample = sample
    (tree,) = run_tree_rollouts(
        policy,
        [EpisodeTask("who directed Kismet?", ["Kismet"])],
        lambda t: ToolEnvironment(graph, t.question, ISP),
        RolloutConfig(toolset="isp", max_turns=2, max_turn_tokens=64, max_obs_tokens=256),
        branches=3,
        max_live=4,
        prune=prune,
    )
    return tree


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    pytest.importorskip("torch")
    from tests.kgfixtures import tiny_agent_model

    return str(tiny_agent_model(tmp_path_factory.mktemp("tiny"), vocab_size=600))


def test_tree_prune_uses_one_cache_per_tree_and_keeps_every_failure(graph, tiny_path):
    from kgsynth.agent.tree import FAILED

    tree = _tree(graph, tiny_path, "tree")
    # step 1: the query without rows is a failure, a leaf (App. F.5), not a live branch
    assert [tree.nodes[i].end for i in (1, 2, 3)] == [None, None, FAILED]
    assert tree.steps[0].pruned == 0 and tree.steps[1].live == 2
    # step 2: the exploration's child that gives the director again is pruned though its
    # sibling never gave it (the tree-wide cache); the three identical failures are all kept
    assert (tree.steps[1].sampled, tree.steps[1].pruned) == (4, 1)
    kids = [tree.nodes[i] for i in tree.nodes[1].children + tree.nodes[2].children]
    assert [k.end for k in kids] == [FAILED, FAILED, FAILED]
    assert [k.episode.turns[-1].text for k in kids] == [BAD, BAD, BAD]


def test_sibling_prune_is_kgsynths_earlier_rule(graph, tiny_path):
    tree = _tree(graph, tiny_path, "siblings")
    # the query without rows goes on; the director under another parent is kept; of the
    # identical failures under one parent only the first
    assert [tree.nodes[i].end for i in (1, 2, 3)] == [None, None, None]
    assert (tree.steps[1].live, tree.steps[1].sampled, tree.steps[1].pruned) == (3, 4, 0)


# --- 3. the question curriculum (§5.1, App. E.1) and 4. the cold start's decomposition (E.2) --


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """One question of every walk structure on the generated movie KG, and that KG's graph."""
    import pyarrow.parquet as pq

    from kgsynth.kg.embedded import EmbeddedKG
    from kgsynth.kg.profiles import get_profile
    from kgsynth.llm.template import TemplateLLM
    from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
    from kgsynth.walk import WalkConfig, run_walks
    from tests.kgfixtures import generated_movie_facts, movie_ntriples

    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    tmp = tmp_path_factory.mktemp("isp_walks")
    mix = "chain-1:0.2,chain-2:0.2,chain-3:0.1,2I:0.1,IP:0.1,PI:0.1,count:0.1,superlative:0.1"
    run_walks(kg, WalkConfig(n=40, seed=5, structures=mix), tmp / "walks.parquet")
    walks = pq.read_table(tmp / "walks.parquet").to_pylist()
    questions, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    first: dict[str, dict] = {}
    for q in questions:
        first.setdefault(q["structure"], q)
    return first, KGGraph(kg)


STEPS = {"chain-1": 1, "chain-2": 2, "chain-3": 3, "2I": 3, "IP": 4, "PI": 4, "count": 3,
         "superlative": 2}  # fmt: skip


def test_reasoning_steps_and_stages_of_every_structure(walked):
    from kgsynth.agent.spaces.isp.curriculum import reasoning_steps, stage

    rows, _ = walked
    assert set(rows) == set(STEPS)
    assert {s: reasoning_steps(r["sparql"]) for s, r in rows.items()} == STEPS
    assert {s: stage(r["sparql"]) for s, r in rows.items()} == {
        s: ("easy", "medium", "hard")[min(n, 3) - 1] for s, n in STEPS.items()
    }
    assert stage(None) == "medium"


def test_curriculum_order_is_easy_then_medium_then_hard(walked):
    import random

    from kgsynth.agent.spaces.isp.curriculum import curriculum_order, stage

    rows, _ = walked
    sparqls = [r["sparql"] for r in rows.values()] * 3 + [None]
    order = curriculum_order(sparqls, random.Random(0))
    assert sorted(order) == list(range(len(sparqls)))
    stages = [stage(sparqls[i]) for i in order]
    assert stages == sorted(stages, key=("easy", "medium", "hard").index)
    assert stages.count("easy") == 3 and stages.count("hard") == 15
    assert curriculum_order(sparqls, random.Random(0)) == order  # seeded
    assert curriculum_order(sparqls, random.Random(1)) != order  # each stage shuffled


def _ops(call: str) -> list[tuple[str, str]]:
    from kgsynth.agent.protocol import OPERATION_RE

    return [(m.group(1), m.group(2)) for m in OPERATION_RE.finditer(call)]


def test_cold_start_oracle_decomposes_the_gold_query(walked):
    from kgsynth.agent.spaces.isp import SPACE
    from kgsynth.agent.spaces.isp.oracle import prefixed

    rows, graph = walked
    for structure, row in rows.items():
        steps = [_ops(c.call) for c in SPACE.oracle_calls(row, graph)]
        # one operation a turn, a <node> always followed by its <SPARQL> (§4.3.2, App. E.2)
        assert all(len(s) == 1 for s in steps), structure
        tags = "".join("n" if s[0][0] == "node" else "q" for s in steps)
        assert "nn" not in tags and not tags.endswith("n"), (structure, tags)
        # one query per reasoning step: the curriculum's count is the decomposition's
        assert tags.count("q") == STEPS[structure], structure
        assert steps[-1][0] == ("SPARQL", prefixed(row["sparql"], row["topic_ids"]))
    # progressive (App. E.2): a -> b -> c, each step exploring where its hop starts and
    # querying the hops so far
    chain = rows["chain-3"]
    steps = [_ops(c.call)[0] for c in SPACE.oracle_calls(chain, graph)]
    hops = chain["branches"][0]
    assert [s for s in steps if s[0] == "node"] == [("node", chain["topic_names"][0]),
                                                    ("node", hops[0]["entity"]),
                                                    ("node", hops[1]["entity"])]  # fmt: skip
    queries = [text for tag, text in steps if tag == "SPARQL"]
    assert [q.count(" . ") for q in queries[:2]] == [1, 2]
    # compositional: each branch alone, then one query that merges them
    two = rows["2I"]
    steps = [_ops(c.call)[0] for c in SPACE.oracle_calls(two, graph)]
    assert [s[0] for s in steps] == ["node", "SPARQL", "node", "SPARQL", "SPARQL"]
    assert [s[1] for s in steps[:3:2]] == two["topic_names"]
    assert steps[4] == ("SPARQL", prefixed(two["sparql"], two["topic_ids"]))
    # a count: the set first, the COUNT last
    count = [_ops(c.call)[0][1] for c in SPACE.oracle_calls(rows["count"], graph)]
    queries = [q for q in count if q.lstrip().startswith("PREFIX")]
    assert "COUNT" not in queries[1] and "COUNT" in queries[2]


def test_oracle_queries_are_written_as_the_templates_show_them(walked):
    """The query turn copies the turn before: its IRIs are the prefixed names the <node>
    templates showed, after the same PREFIX lines, and the rewritten query runs as the
    stored one does."""
    from kgsynth.agent.spaces.isp.oracle import prefixed

    rows, graph = walked
    row = rows["chain-2"]
    query = row["sparql"]
    short = prefixed(query, row["topic_ids"])
    body = short.split("\nSELECT", 1)[1]
    assert "<http://kgsynth.org/" not in body and "entity:" in body
    # the topic's namespace first, as a template declares it; W3C's by their usual names
    assert short.startswith("PREFIX entity: <http://kgsynth.org/entity/>\n")
    assert "PREFIX rdfs: <http://www.w3.org/2000/01/rdf-schema#>" in short  # not ns1:
    assert prefixed(short) == short
    answers = [{r["answer"].value for r in graph.kg.select(q)} for q in (short, query)]
    assert answers[0] == answers[1] and answers[0]


def test_cold_start_trajectories_replay_every_step(walked):
    from kgsynth.agent.config import AgentConfig
    from kgsynth.llm.template import TemplateLLM
    from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories

    rows, graph = walked
    wanted = [rows[s] for s in ("chain-3", "2I", "IP", "PI", "superlative")]
    cfg = TrajectoryConfig(agent=AgentConfig(toolset="isp", max_turns=10))
    out, rejected, _ = synthesize_trajectories(wanted, cfg, graph=graph, llm=TemplateLLM())
    assert rejected == []
    for q, row in zip(wanted, out, strict=True):
        assistant = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert sum("<SPARQL>" in a for a in assistant) == STEPS[q["structure"]]
        tool_msgs = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        assert all("no rows" not in m and "Error" not in m for m in tool_msgs)
        # every entity a query names, it names as an earlier <relation> observation showed it
        shown, checked = "", 0
        for m in row["messages"]:
            if m["role"] == "tool":
                shown += m["content"]
            elif m["role"] == "assistant" and "<SPARQL>" in m["content"]:
                names = {n.rstrip(")") for n in re.findall(r"entity:[^\s),]+", m["content"])}
                assert all(n in shown for n in names), (names, q["structure"])
                checked += len(names)
        assert checked or q["structure"] == "superlative"


def test_rl_with_the_isp_options_draws_the_easy_question_first(tiny_path, tmp_path, monkeypatch):
    """``train rl --question-curriculum difficulty --tree-prune tree --progress-rule previous``:
    one real tree step on CPU; the question drawn is the easy one, though the plain shuffle of
    the same seed starts with a hard one."""
    import json
    import random

    import polars as pl
    from typer.testing import CliRunner

    from kgsynth.agent.rollout import TokenPolicy
    from kgsynth.cli import app
    from kgsynth.kg.importer import import_kg
    from tests.kgfixtures import movie_ntriples

    (tmp_path / "kg.nt").write_text(movie_ntriples())
    import_kg(tmp_path / "kg.nt", tmp_path / "kg", force=True)
    hard = f"SELECT ?x WHERE {{ ?f {STARRED} {BETTE} . ?f {DIRECTED} ?d . ?g {DIRECTED} ?d . ?g {GENRE} ?x }}"
    easy = {"question": "who directed Kismet?", "topic_names": ["Kismet"],
            "answer_names": ["William Dieterle"], "sparql": KISMET_DIRECTOR}  # fmt: skip
    rows = [dict(easy, question=f"hard question {i}", sparql=hard) for i in range(2)]
    plain = list(range(3))
    random.Random(0).shuffle(plain)
    rows.insert(plain[1], easy)  # the plain order would not draw it first
    assert rows[plain[0]]["sparql"] == hard
    pl.DataFrame(rows).write_parquet(tmp_path / "q.parquet")
    asked: list[str] = []

    def sample(self, batch, **kw):
        asked.extend(self.tok.decode(ids) for ids in batch)
        new = self.encode("<think>t</think>\\boxed{William Dieterle}")
        return [(new, [0.0] * len(new), False) for _ in batch]

    monkeypatch.setattr(TokenPolicy, "sample", sample)
    res = CliRunner().invoke(app, [
        "train", "rl", "--questions", str(tmp_path / "q.parquet"), "--kg", str(tmp_path / "kg"),
        "--init", tiny_path, "--out", str(tmp_path / "rl"), "--recipe", "tiny",
        "--rollout", "tree", "--toolset", "isp", "--allow-toolset-change", "--branches", "2",
        "--max-tree-nodes", "2", "--max-turns", "1", "--max-steps", "1",
        "--questions-per-step", "1", "--reward", "isp", "--question-curriculum", "difficulty",
        "--tree-prune", "tree", "--progress-rule", "previous", "--seed", "0",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert asked and all("who directed Kismet?" in a for a in asked)
    config = json.loads((tmp_path / "rl" / "rl_config.json").read_text())["config"]
    assert (config["question_curriculum"], config["tree_prune"], config["progress_rule"]) == (
        "difficulty", "tree", "previous")  # fmt: skip


# --- 5. the turn format of ISP-KGR's prompt (App. D.1, Figure 8) --------------------------------


def test_answers_are_boxed_inside_answer_tags_and_read_back():
    from kgsynth.agent.protocol import IspFormat
    from kgsynth.agent.spaces import parse_turn

    text = IspFormat().answer_turn("found", ["Juarez", "Washington, D.C."])
    assert (
        text == "<think>found</think>\n<answer>\\boxed{Juarez} \\boxed{Washington, D.C.}</answer>"
    )
    turn = parse_turn(text, "isp")
    assert turn.format_error is None and turn.answer == ["Juarez", "Washington, D.C."]


def test_node_relations_come_inside_relation_tags(graph):
    ep = isp_run(
        graph, DIRECTORS, ["<node>Bette Davis</node>", f"<node>Jezebel</node>{sparql(FILMS)}"]
    )
    one, two = (m["content"] for m in ep.messages if m["role"] == "tool")
    assert one.startswith("<information><relation>\n") and one.endswith(
        "\n</relation></information>"
    )
    assert 'Templates of "Bette Davis"' in one
    # in a step of several operations only the node's part is wrapped; the rows are not
    node_part, query_part = two.split("Operation 2 (SPARQL):")
    assert "<relation>" in node_part and "</relation>" in node_part
    assert "<relation>" not in query_part and "Jezebel" in query_part


def test_the_isp_prompts_name_relation_information_and_answer():
    from kgsynth.agent.prompt import system_prompt

    for style in ("full", "short"):
        text = system_prompt("isp", 6, style)
        assert "<relation>" in text and "<information>" in text
        assert "<answer>\\boxed{" in text and "<node>" in text and "<SPARQL>" in text
