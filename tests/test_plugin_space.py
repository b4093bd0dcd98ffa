"""A sixth action space added in this one file (issue 45): registered, it runs through the oracle,
the filter and eval like the five built in, with nothing outside this file knowing its name.

The toy space ``hops`` has one tool, ``follow("Entity", "relation")``: the entities one relation
reaches from an entity, either direction, shown by name through the environment's triple list.
Its oracle follows each hop of a chain walk with one call, each after a thought of its own
(the template backend writes it unchanged), and its copy drills call ``follow``."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow.parquet as pq
import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces import names, register, space
from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.core.stage import Reject
from kgsynth.datasets.qafiles import QARecord
from kgsynth.eval.config import EvalConfig
from kgsynth.eval.subjects import evaluate
from kgsynth.filter import FilterConfig, run_filters
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.template import TemplateLLM
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories
from kgsynth.train.drills import copy_drills
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import generated_movie_facts, movie_ntriples
from tests.test_trajectories import ScriptedPolicy


def follow(env: Any, name: str, relation: str) -> Any:
    entity, notes = env._entity(name)
    rels, missing = env.select_relations(entity, [relation])
    return env.triple_list(entity, rels, notes, missing)


class Hops(ActionSpace):
    name = "hops"
    tool_help: ClassVar[list[dict[str, str]]] = [
        {
            "usage": 'follow("Entity Name", "relation")',
            "description": "the entities one relation reaches",
        }
    ]

    def make_tools(self, env: Any) -> dict:
        return {"follow": (2, lambda e, r: follow(env, e, r))}

    def oracle_calls(self, row: dict[str, Any], graph: Any = None) -> list[OracleCall]:
        if len(row["branches"]) != 1:
            raise Reject("not_a_chain")
        calls, cur = [], row["topic_names"][0]
        for hop in row["branches"][0]:
            call = f"follow({json.dumps(cur)}, {json.dumps(hop['relation'])})"
            calls.append(OracleCall("triples", call, cur, hop))
            cur = hop["entity"]
        return calls

    def thought(self, kind: str, entity: str, hop: Any, *args: Any) -> str:
        if kind == "triples":
            return f"One hop: {hop['relation']} from {entity}."
        return super().thought(kind, entity, hop, *args)

    def drill_call(self, topic: str, relations: Sequence[str], rng: random.Random) -> str:
        return f"follow({json.dumps(topic)}, {json.dumps(rng.choice(relations))})"

    def replay(self, row: dict[str, Any], env: Any, **options: Any) -> list[tuple[Any, Any]]:
        steps = []
        for c in self.oracle_calls(row):
            result = env.execute(c.call)
            if result.error is not None or c.hop["entity"] not in result.entities:
                raise Reject("gold_entity_not_retrievable")
            steps.append((c, result))
        return steps


@pytest.fixture(scope="module")
def hops_space():
    register(Hops())
    return space("hops")


def test_a_plugin_space_runs_oracle_filter_and_eval(hops_space, tmp_path):
    assert "hops" in names() and hops_space.name == "hops"
    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    graph = KGGraph(kg)
    run_walks(kg, WalkConfig(n=30, seed=3), tmp_path / "walks.parquet")
    walks = pq.read_table(tmp_path / "walks.parquet").to_pylist()
    questions, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    agent = AgentConfig(toolset="hops")
    rows, rejected, _ = synthesize_trajectories(
        questions, TrajectoryConfig(agent=agent), graph=graph, llm=TemplateLLM()
    )
    assert len(rows) >= 10
    assert {r["reject_reason"] for r in rejected} <= {"not_a_chain", "gold_entity_not_retrievable"}
    first = rows[0]["messages"]
    assert 'follow("' in first[0]["content"]  # the space's tools in its system prompt
    assert first[2]["content"].startswith("<think>") and "<kg-query>follow(" in first[2]["content"]
    # the space's own thoughts, and the answer's default one
    assert first[2]["content"].startswith("<think>One hop: ")
    assert first[-1]["content"].startswith("<think>The facts I found answer the question.")
    accepted, _, stats = run_filters(rows, FilterConfig())
    corpus = accepted.to_pylist()
    assert stats["accepted"] == len(corpus) >= 5, stats
    drills = copy_drills([r["messages"] for r in corpus], 9, toolset="hops")
    calls = [d[2]["content"] for d in drills if d[2]["content"].startswith("<kg-query>")]
    assert len(calls) == 3 and all(c.startswith("<kg-query>follow(") for c in calls)
    records = [
        QARecord(
            r["question"],
            r["question"],
            list(r["topic_names"]),
            list(r["gold_answers"]),
            None,
            None,
            i,
        )
        for i, r in enumerate(corpus, 1)
    ]
    # a policy that learned the corpus by heart: each question's accepted trajectory's turns
    learned = ScriptedPolicy(
        {
            r["question"]: [m["content"] for m in r["messages"] if m["role"] == "assistant"]
            for r in corpus
        }
    )
    preds, metrics = evaluate(records, learned, graph, EvalConfig(agent=agent))
    assert all(p["tool_errors"] == 0 and p["format_errors"] == 0 for p in preds)
    assert all(c.startswith("follow(") for p in preds for c in p["tool_calls"])
    assert metrics["overall"]["hits_at_1"] == 1.0
