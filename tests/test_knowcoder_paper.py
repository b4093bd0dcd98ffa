"""KnowCoder-A1 as its text says (knowcoder-a1.txt): SearchGraphPatterns around the sketch's ?x
(§4.1, App. F), answers in \\boxed{} and the format reward on them (§4.3.2), and the cold start
that samples an LLM with trial-and-error demonstrations and keeps what the outcome filter
accepts (§4.2.1)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import pyarrow.parquet as pq
import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.loop import EpisodeTask, run_episodes
from kgsynth.agent.rewards import Gold, RewardSpec
from kgsynth.agent.spaces import space
from kgsynth.agent.spaces.knowcoder.patterns import pattern_row, row_predicates
from kgsynth.agent.toolcall import ToolCall
from kgsynth.agent.tools import ErrorType, ToolEnvironment
from kgsynth.core.errors import ConfigError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.base import LLM, Completion
from kgsynth.llm.template import TemplateLLM
from kgsynth.synthesize.coldstart import TEMPLATE_NOTE
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import NS, E, R, freebase_kg, generated_movie_facts, movie_kg, movie_ntriples

DIRECTED, STARRED, YEAR, GENRE = (f"<{R}{r}>" for r in ("directed_by", "starred_actors", "release_year", "has_genre"))  # fmt: skip


def env_for(kg: EmbeddedKG, question: str = "", **config: object) -> ToolEnvironment:
    return ToolEnvironment(KGGraph(kg), question, AgentConfig(toolset="knowcoder", **config))


def patterns(env: ToolEnvironment, sketch: str, hint: str = "") -> list[str]:
    result = env.call(ToolCall("SearchGraphPatterns", (sketch, hint)))
    assert result.ok, result
    return result.text.splitlines()


@pytest.fixture(scope="module")
def movies() -> EmbeddedKG:
    return movie_kg()


# --- 1. SearchGraphPatterns (§4.1) ---------------------------------------------------------


def test_patterns_expand_around_the_sketch_variable_as_rows(movies):
    env = env_for(movies)
    lines = patterns(env, 'SELECT DISTINCT ?x WHERE { VALUES ?x { "Kismet" } }', "who directed")
    assert lines == [
        f"Graph patterns of ?x = Kismet <{E}Kismet> (showing 4 of 4, best match first):",
        f'(?x, {DIRECTED}, "William Dieterle")',
        f'(?x, {DIRECTED} -> ^{DIRECTED}, "Juarez")',  # Kismet's director directed Juarez
        f'(?x, {YEAR}, "1944")',
        f'(?x, {STARRED}, "Marlene Dietrich")',
    ]


def test_the_variable_is_the_sketchs_own_and_bound_by_its_patterns(movies):
    """App. F writes ``SELECT ?e WHERE { VALUES ?e {...} }``; a sketch may also bind the
    variable through triple patterns: here ?e is the film William Wyler directed."""
    env = env_for(movies)
    sketch = f'SELECT ?e WHERE {{ ?e {DIRECTED} ?d . VALUES ?d {{ "William Wyler" }} }}'
    lines = patterns(env, sketch, "genre")
    assert lines[0].startswith(f"Graph patterns of ?e = Jezebel <{E}Jezebel>")
    assert lines[1] == f'(?e, {GENRE}, "Drama")'
    assert all(line.startswith("(?e, ") for line in lines[1:])


def test_a_row_whose_hops_all_point_at_the_variable_is_written_from_the_value():
    """?x at the tail: the film directed by William Dieterle points at him."""
    env = env_for(movie_kg())
    lines = patterns(env, f"SELECT ?x WHERE {{ VALUES ?x {{ <{E}William%20Dieterle> }} }}")
    assert f'("Juarez", {DIRECTED}, ?x)' in lines or f'("Kismet", {DIRECTED}, ?x)' in lines
    assert pattern_row([("u:r1", False), ("u:r2", False)], "x", 'say "hi"') == (
        '("say \\"hi\\"", <u:r2> -> <u:r1>, ?x)'
    )
    assert (
        pattern_row([("u:r1", True), ("u:r2", False)], "x", "v") == '(?x, <u:r1> -> ^<u:r2>, "v")'
    )


def test_at_most_ten_rows_of_one_and_two_hops():
    facts = [("Hub", f"rel_{i:02d}", f"Node {i}") for i in range(30)]
    facts += [(f"Node {i}", "next", f"Far {i}") for i in range(30)]
    kg = EmbeddedKG.from_ntriples(movie_ntriples(facts), get_profile("generic"))
    lines = patterns(env_for(kg), 'SELECT DISTINCT ?x WHERE { VALUES ?x { "Hub" } }', "next")
    assert len(lines) == 11 and "(showing 10 of " in lines[0]
    two_hop = [line for line in lines[1:] if " -> " in line]
    assert two_hop and all(line.endswith(f'<{R}next>, "Far {line.split("rel_")[1][:2].lstrip("0") or "0"}")') for line in two_hop)  # fmt: skip


def test_a_cvt_path_reads_r1_to_r2_with_the_value_at_its_end():
    """Freebase's unnamed (CVT) node between two relations: App. F's
    ``(?e, film.film_character.portrayed_in_films -> film.performance.actor, "Brenda Song")``."""
    env = env_for(freebase_kg())
    lines = patterns(env, f"SELECT ?e WHERE {{ VALUES ?e {{ <{NS}m.irons> }} }}", "character")
    actor, perf = f"<{NS}film.actor.film>", f"<{NS}film.performance.character>"
    assert lines[1] == f'(?e, {actor} -> {perf}, "Elliot Mantle")'
    assert all(line.count(" -> ") <= 1 for line in lines[1:])  # two hops at most
    assert all(line.startswith("(?e, <") or line.endswith(", ?e)") for line in lines[1:])
    assert row_predicates("\n".join(lines)) and all(
        p.startswith(f"<{NS}") for p in row_predicates("\n".join(lines))
    )


@pytest.mark.parametrize(
    ("sketch", "error"),
    [
        ("ASK { ?x ?p ?o }", ErrorType.WRONG_ARGUMENTS),
        ('VALUES ?x { "Kismet" }', ErrorType.WRONG_ARGUMENTS),
        ('SELECT ?x WHERE { VALUES ?x { "Nobody Here" } }', ErrorType.NO_RESULTS),
        ("SELECT ?x WHERE { VALUES ?x { 1944 } }", ErrorType.NO_RESULTS),  # a literal: no node
        ("SELECT ?x WHERE { ?x ?p ", ErrorType.QUERY_REFUSED),  # does not parse
    ],
)
def test_bad_sketches_are_typed_errors(movies, sketch, error):
    result = env_for(movies).call(ToolCall("SearchGraphPatterns", (sketch, "")))
    assert result.error == error, result.text


def test_the_entities_reading_stays_a_named_option(movies):
    lines = patterns(env_for(movies, knowcoder_patterns="entities"), '"Kismet"', "who directed")
    assert lines[1] == f"<{E}Kismet> {DIRECTED} ?x .  # Kismet directed_by ?x; e.g. ?x = William Dieterle"  # fmt: skip
    with pytest.raises(ConfigError, match="knowcoder_patterns must be variable or entities"):
        AgentConfig(knowcoder_patterns="neighbours")


# --- 2. answers in \boxed{} and the format reward (§4.3.2) -----------------------------------


class Script(LLM):
    """A scripted policy: each episode's turns in order, by question."""

    backend = "scripted"
    model = "script"

    def __init__(self, scripts: dict[str, Sequence[str]]) -> None:
        super().__init__()
        self.scripts = {q: list(t) for q, t in scripts.items()}
        self.systems: list[str] = []

    def generate_batch(self, requests, progress=None):
        out = []
        for r in requests:
            msgs = r.message_dicts()
            self.systems.append(msgs[0]["content"])
            question = msgs[1]["content"].split("\n")[0].removeprefix("Question: ")
            script = self.scripts.get(question) or ["<think>?</think>"]
            out.append(Completion(script.pop(0) if len(script) > 1 else script[0]))
        return out


def _episode(kg: EmbeddedKG, answer_turn: str):
    query = f"SELECT ?d WHERE {{ <{E}Kismet> {DIRECTED} ?d }}"
    q = "who directed Kismet"
    llm = Script(
        {q: [f"<think>run it</think><kg-query>ExecuteSPARQL({json.dumps(query)})</kg-query>", answer_turn]}
    )  # fmt: skip
    graph = KGGraph(kg)
    cfg = AgentConfig(toolset="knowcoder")
    (ep,) = run_episodes(
        llm,
        [EpisodeTask(q, ["Kismet"])],
        lambda t: ToolEnvironment(graph, q, cfg),
        toolset="knowcoder",
        max_turns=3,
    )
    return ep, llm


def test_knowcoder_answers_in_boxes_and_the_format_reward_reads_them(movies):
    spec = RewardSpec.parse("knowcoder-a1")
    gold = Gold(answers=["William Dieterle"])
    boxed, llm = _episode(movies, "<think>done</think><answer>\\boxed{William Dieterle}</answer>")
    assert boxed.predicted_answers == ["William Dieterle"]
    res = spec.score(boxed, gold)
    assert res.components == {"fbeta": 1.0, "format": 1.0} and res.total == 1.0  # capped at 1
    assert "\\boxed{" in llm.systems[0]  # the prompt asks for the box
    # a JSON-list answer (the other spaces' form) has no box: no prediction, no format reward
    plain, _ = _episode(movies, '<think>done</think><answer>["William Dieterle"]</answer>')
    assert plain.turns[-1].format_error == "answer not in \\boxed{}"
    assert spec.score(plain, gold).components == {"fbeta": 0.0, "format": 0.0}


def test_the_knowcoder_space_writes_and_asks_for_boxes():
    turns = space("knowcoder").turns
    assert turns.answer_action(["A", "B"]) == "<answer>\\boxed{A} \\boxed{B}</answer>"
    assert "\\boxed{" in turns.final_answer_prompt and "\\boxed{" in turns.no_action_hint
    parsed = turns.parse_turn('<think>t</think><answer>\\boxed{["A", "B"]}</answer>')
    assert parsed.answer == ["A", "B"] and parsed.format_error is None
    assert turns.parse_turn("<think>t</think><answer>\\boxed{A</answer>").format_error
    short = space("knowcoder").system_prompt(4, "short")
    assert "\\boxed{name}" in short and "SearchGraphPatterns" in short


# --- 4. the cold start (§4.2.1) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    tmp = tmp_path_factory.mktemp("coldstart")
    run_walks(kg, WalkConfig(n=30, seed=5, structures="chain-1:1"), tmp / "walks.parquet")
    walks = pq.read_table(tmp / "walks.parquet").to_pylist()
    accepted, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    return kg, accepted[:4]


def _coldstart(**options: object) -> TrajectoryConfig:
    agent = AgentConfig(toolset="knowcoder", max_turns=3)
    return TrajectoryConfig(mode="coldstart", agent=agent, split="all", **options)  # type: ignore[arg-type]


def test_coldstart_samples_with_the_demos_and_keeps_what_the_outcome_filter_accepts(questions):
    kg, rows = questions
    scripts = {}
    for row in rows:
        run = f"<think>query</think><kg-query>ExecuteSPARQL({json.dumps(row['sparql'])})</kg-query>"
        gold = " ".join(f"\\boxed{{{a}}}" for a in row["answer_names"])
        scripts[row["question"]] = [
            run, f"<think>found</think><answer>{gold}</answer>",  # sample 0: kept
            "<think>guess</think><answer>\\boxed{Nobody At All}</answer>",  # 1: wrong
            f"<think>guess</think><answer>{gold}</answer>",  # 2: right but never observed
        ]  # fmt: skip
    llm = Script(scripts)
    kept, rejected, stats = synthesize_trajectories(
        rows, _coldstart(samples=3), graph=KGGraph(kg), llm=llm
    )
    assert all("Example 1 (an empty result, then a fix)" in s for s in llm.systems)
    assert [r["mode"] for r in kept] == ["coldstart"] * len(rows)
    assert all(r["num_turns"] == 2 for r in kept)
    # the stored prompt is the agent's own, without the demonstrations
    assert all("Example 1" not in r["messages"][0]["content"] for r in kept)
    reasons = sorted(r["reject_reason"] for r in rejected)
    assert reasons == sorted(["wrong_answer"] * len(rows) + ["ungrounded_answer"] * len(rows))
    assert stats["trajectories"] == len(rows)


def test_coldstart_through_hf_on_a_tiny_model(questions, tmp_path):
    """A real (tiny, untrained) model: it is prompted with the demonstrations and what it
    samples goes through the outcome filter (an untrained model's rollouts are all turned
    down, each with the filter's reason)."""
    from kgsynth.llm.hf_backend import HFLLM
    from kgsynth.train.tiny import build_tiny_model

    kg, rows = questions
    texts = [r["question"] for r in rows] + ["<think>x</think><answer>\\boxed{y}</answer>"]
    model_dir = build_tiny_model(texts, tmp_path / "tiny", vocab_size=500)

    systems: list[str] = []

    class Recording(HFLLM):
        def generate_batch(self, requests, progress=None):
            systems.extend(r.message_dicts()[0]["content"] for r in requests)
            return super().generate_batch(requests, progress)

    llm = Recording(str(model_dir), batch_size=8)
    agent = AgentConfig(toolset="knowcoder", max_turns=2, max_turn_tokens=12)
    cfg = TrajectoryConfig(mode="coldstart", agent=agent, split="all", samples=2)
    kept, rejected, _ = synthesize_trajectories(rows[:2], cfg, graph=KGGraph(kg), llm=llm)
    assert systems and all("Example 2 (a wrong kind of answer, then a type)" in s for s in systems)
    assert kept == [] and len(rejected) == 4
    filter_reasons = {"no_answer", "wrong_answer", "ungrounded_answer", "bad_format", "llm_error"}
    assert {r["reject_reason"] for r in rejected} <= filter_reasons


def test_coldstart_with_the_template_backend_is_the_scripted_stand_in(questions, caplog):
    kg, rows = questions
    with caplog.at_level(logging.WARNING, logger="kgsynth.synthesize.coldstart"):
        kept, _, stats = synthesize_trajectories(
            rows, _coldstart(trial_and_error=1.0), graph=KGGraph(kg), llm=TemplateLLM()
        )
    notes = [r.getMessage() for r in caplog.records if "coldstart" in r.getMessage()]
    assert notes == [TEMPLATE_NOTE.format(share=1.0)]
    assert kept and {r["mode"] for r in kept} <= {"oracle", "oracle_trial"}
    assert stats["trial_and_error"] > 0


def test_coldstart_needs_the_knowcoder_tools():
    with pytest.raises(ConfigError, match="--mode coldstart is KnowCoder-A1's cold start"):
        TrajectoryConfig(mode="coldstart")
