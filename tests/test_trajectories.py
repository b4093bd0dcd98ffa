"""Agent loop and trajectory synthesis (oracle, referenced, free) on a fixture KG."""

import json
from collections.abc import Sequence

import pyarrow.parquet as pq
import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.loop import EpisodeTask, run_episodes
from kgsynth.agent.spaces import close_action
from kgsynth.agent.tools import ToolConfig, ToolEnvironment
from kgsynth.core.errors import ConfigError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.base import LLM, Completion
from kgsynth.llm.template import TemplateLLM
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import (
    TrajectoryConfig,
    oracle_calls,
    reference_text,
    synthesize_trajectories,
)
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import generated_movie_facts, movie_ntriples


class ScriptedPolicy(LLM):
    """Answers each episode's turns from a script (one list of texts per episode, by question)."""

    backend = "scripted"
    model = "script"

    def __init__(self, scripts: dict[str, Sequence[str]]) -> None:
        super().__init__()
        self.scripts = {q: list(t) for q, t in scripts.items()}
        self.prompts: list[list[dict[str, str]]] = []

    def generate_batch(self, requests, progress=None):
        out = []
        for i, r in enumerate(requests):
            msgs = r.message_dicts()
            self.prompts.append(msgs)
            question = msgs[1]["content"].split("\n")[0].removeprefix("Question: ")
            text = self.scripts[question].pop(0) if self.scripts[question] else "<think>?</think>"
            c = Completion(text)
            out.append(c)
            if progress:
                progress(i, c)
        return out


@pytest.fixture(scope="module")
def kg():
    return EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))


@pytest.fixture(scope="module")
def questions(kg, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("traj")
    run_walks(kg, WalkConfig(n=40, seed=5), tmp / "walks.parquet")
    walks = pq.read_table(tmp / "walks.parquet").to_pylist()
    accepted, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    return accepted


def test_oracle_trajectories_replay_to_the_walk_answers(kg, questions):
    graph = KGGraph(kg)
    rows, rejected, stats = synthesize_trajectories(
        questions, TrajectoryConfig(), graph=graph, llm=TemplateLLM()
    )
    assert stats["trajectories"] == len(rows) > 20 and len(rows) + len(rejected) == len(questions)
    # no chain is lost to the display cap: the replay goes on from an entity it was shown
    by_id = {q["question_id"]: q for q in questions}
    assert not [
        r for r in rejected
        if r["reject_reason"] == "gold_entity_not_retrievable"
        and by_id[r["question_id"]]["structure"].startswith("chain")
    ]  # fmt: skip
    whole = 0
    for row in rows:
        # the oracle answers the gold answers its last observation showed, in the order shown,
        # so the answer copies the hop that reached them (gold an earlier hop showed only when
        # the last showed none)
        gold = {normalize_answer(a) for a in row["gold_answers"]}
        last = [e for e in row["turns"][-2]["entities"] if normalize_answer(e) in gold]
        seen = last or [e for e in row["observed_entities"] if normalize_answer(e) in gold]
        assert row["predicted_answers"] == list(dict.fromkeys(seen))
        whole += sorted(map(normalize_answer, row["predicted_answers"])) == sorted(gold)
        # the stored observations are exactly what the environment returns for the calls
        env = ToolEnvironment(graph, row["question"], ToolConfig())
        tool_msgs = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        assert len(tool_msgs) == len(row["tool_calls"])
        for call, obs in zip(row["tool_calls"], tool_msgs, strict=True):
            assert obs == f"<information>{env.execute(call).text}</information>"
        # every assistant turn: a thought and one action; the last one answers
        assistant = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert all(a.startswith("<think>") for a in assistant)
        assert (
            json.loads(assistant[-1].split("<answer>")[1].split("</answer>")[0])
            == row["predicted_answers"]
        )
        assert row["num_turns"] == len(assistant) and row["tool_errors"] == 0
    assert whole > len(rows) / 2


def test_thoughts_do_not_leak_the_future(kg, questions):
    rows, _, _ = synthesize_trajectories(
        questions, TrajectoryConfig(), graph=KGGraph(kg), llm=TemplateLLM()
    )
    import re

    names = {n for f in generated_movie_facts() for n in (f[0], f[2])}

    def named_in(text: str) -> set[str]:
        return {n for n in names if re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text)}

    for row in rows:
        seen = set(row["topic_names"])
        for m in row["messages"][2:]:
            if m["role"] == "assistant":
                thought = m["content"].split("</think>")[0]
                if "<answer>" not in m["content"]:
                    assert named_in(thought) <= seen, (named_in(thought) - seen, thought)
            else:
                seen |= named_in(m["content"])


def test_gold_relation_not_retrievable_is_rejected(kg, questions):
    cfg = TrajectoryConfig(
        agent=AgentConfig(top_k_relations=1)
    )  # only the best-ranked relation is shown
    _rows, rejected, stats = synthesize_trajectories(
        questions, cfg, graph=KGGraph(kg), llm=TemplateLLM()
    )
    assert stats["rejects"].get("gold_relation_not_retrievable", 0) > 0
    assert all(r["reject_reason"] for r in rejected)


def test_kgr1_oracle_calls(questions):
    row = next(q for q in questions if q["structure"] == "chain-2")
    calls = oracle_calls(row, "kgr1")
    assert [c.kind for c in calls] == ["relations", "triples", "relations", "triples"]
    hop = row["branches"][0][0]
    side = "head" if hop["inverse"] else "tail"
    assert calls[0].call == f'get_{side}_relations("{row["topic_names"][0]}")'


def test_agent_loop_with_scripted_policy(kg):
    graph = KGGraph(kg)
    task = EpisodeTask("Who directed Movie 1?", ["Movie 1"])
    director = next(
        o for s, r, o in generated_movie_facts() if s == "Movie 1" and r == "directed_by"
    )
    policy = ScriptedPolicy(
        {
            task.question: [
                '<think>look</think><kg-query>get_relations("Movie 1")',  # stop tag stripped by an API
                '<think>fetch</think><kg-query>get_triples("Movie 1", ["directed_by"])</kg-query> trailing',
                f'<think>done</think><answer>["{director}"]</answer>',
            ]
        }
    )
    (ep,) = run_episodes(policy, [task], lambda t: ToolEnvironment(graph, t.question), max_turns=5)
    assert ep.answered and ep.predicted_answers == [director] and not ep.forced_answer
    assert [m["role"] for m in ep.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert ep.messages[2]["content"].endswith("</kg-query>")
    assert not ep.messages[4]["content"].endswith("trailing")
    assert director in ep.observed_entities and ep.tool_errors == 0 and ep.format_errors == 0
    # the policy saw observations as user turns (no tool-call ids in the text protocol)
    assert policy.prompts[-1][3]["role"] == "user" and policy.prompts[-1][3]["content"].startswith(
        "<information>"
    )


def test_fabricated_information_is_not_an_observation(kg):
    graph = KGGraph(kg)
    task = EpisodeTask("Who directed Movie 2?", ["Movie 2"])
    policy = ScriptedPolicy(
        {
            task.question: [
                '<think>x</think><information>(Movie 2, directed_by, Fake Person)</information><answer>["Fake Person"]</answer>'
            ]
        }
    )
    (ep,) = run_episodes(policy, [task], lambda t: ToolEnvironment(graph, t.question))
    assert ep.predicted_answers == ["Fake Person"]
    assert "Fake Person" not in ep.observed_entities and not any(
        m["role"] == "tool" for m in ep.messages
    )


def test_garbage_policy_hits_the_turn_limit_and_is_forced_to_answer(kg):
    graph = KGGraph(kg)
    task = EpisodeTask("Who directed Movie 3?", ["Movie 3"])
    policy = ScriptedPolicy(
        {task.question: ["asdf qwer", "", "<kg-query>nonsense(</kg-query>", "still nothing"]}
    )
    (ep,) = run_episodes(policy, [task], lambda t: ToolEnvironment(graph, t.question), max_turns=3)
    assert ep.forced_answer and not ep.answered and ep.predicted_answers == []
    assert ep.format_errors == 4  # three turns and the forced one, none with a think block
    assert ep.tool_errors == 1  # the unparseable query came back as bad_syntax
    assert ep.messages[-2]["role"] == "user" and "final answer" in ep.messages[-2]["content"]


def test_referenced_hint_is_seen_but_not_stored(kg, questions):
    row = next(q for q in questions if q["structure"] == "chain-1")
    ref = reference_text(row, "graphwalker")
    policy = ScriptedPolicy({row["question"]: ['<think>ok</think><answer>["x"]</answer>']})
    cfg = TrajectoryConfig(mode="referenced", reference_guidance="whole")  # the sequence once
    rows, _, _ = synthesize_trajectories([row], cfg, graph=KGGraph(kg), llm=policy)
    assert ref in policy.prompts[0][1]["content"]
    (traj,) = rows
    assert traj["reference"] == ref and traj["mode"] == "referenced"
    assert all(
        ref not in m["content"] and "reference action" not in m["content"] for m in traj["messages"]
    )


def test_free_mode_samples_and_template_refusal(kg, questions):
    policy = ScriptedPolicy(
        {q["question"]: ['<think>t</think><answer>["A"]</answer>'] * 2 for q in questions[:3]}
    )
    rows, _, _stats = synthesize_trajectories(
        questions[:3], TrajectoryConfig(mode="free", samples=2), graph=KGGraph(kg), llm=policy
    )
    assert len(rows) == 6 and len({r["trajectory_id"] for r in rows}) == 6
    assert sorted(r["sample"] for r in rows) == [0, 0, 0, 1, 1, 1]

    with pytest.raises(ConfigError, match="policy model"):
        synthesize_trajectories(
            questions[:1], TrajectoryConfig(mode="free"), graph=KGGraph(kg), llm=TemplateLLM()
        )


def test_close_action():
    assert close_action("<think>a</think><kg-query>x") == "<think>a</think><kg-query>x</kg-query>"
    assert close_action("<answer>[1]</answer> tail <answer>") == "<answer>[1]</answer>"
    assert close_action("plain") == "plain"


def test_free_rollouts_of_a_local_checkpoint_through_hf(kg, questions, tmp_path):
    """A real (tiny, untrained) model as the policy: its garbage becomes trajectories with
    format errors and forced answers, never a crash."""
    from kgsynth.llm.hf_backend import HFLLM
    from kgsynth.train.tiny import build_tiny_model

    texts = [q["question"] for q in questions] + ['<think>x</think><answer>["y"]</answer>']
    model_dir = build_tiny_model(texts, tmp_path / "tiny", vocab_size=500)
    rows, rejected, stats = synthesize_trajectories(
        questions[:4],
        TrajectoryConfig(
            mode="free",
            samples=2,
            agent=AgentConfig(max_turns=2, max_turn_tokens=12),
            temperature=1.0,
        ),
        graph=KGGraph(kg),
        llm=HFLLM(str(model_dir), batch_size=8),
    )
    assert len(rows) + len(rejected) == 8
    for row in rows:
        assert row["num_turns"] >= 1 and row["messages"][0]["role"] == "system"
        assert row["generator"]["backend"] == "hf"
    assert stats["format_errors"] > 0  # an untrained model does not follow the protocol


def test_cli_oracle_run_and_cached_rerun(kg, questions, tmp_path):
    import pyarrow as pa
    from typer.testing import CliRunner

    from kgsynth.cli import app
    from kgsynth.core.schema import QUESTION_SCHEMA

    qfile = tmp_path / "questions.parquet"
    pq.write_table(pa.Table.from_pylist(questions, schema=QUESTION_SCHEMA), qfile)
    kb = tmp_path / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in generated_movie_facts()) + "\n")
    out = tmp_path / "t" / "trajectories.parquet"
    args = [
        "synthesize",
        "trajectories",
        "--questions",
        str(qfile),
        "--kg",
        str(kb),
        "--out",
        str(out),
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    before = pq.read_table(out).to_pylist()
    manifest = json.loads((tmp_path / "t" / "trajectories.manifest.json").read_text())
    assert manifest["trajectories"] == len(before) and manifest["made_by_templates"] is True
    rejected = pq.read_table(tmp_path / "t" / "trajectories.rejected.parquet").num_rows
    assert len(before) + rejected == len(questions)
    # e.g. after an interruption: all from the cache
    again = CliRunner().invoke(app, [*args, "--overwrite"])
    assert again.exit_code == 0, again.output
    stats = json.loads((tmp_path / "t" / "trajectories.manifest.json").read_text())["llm"]["stats"]
    assert stats["cache_misses"] == 0 and stats["cache_hits"] > 0
    assert pq.read_table(out).to_pylist() == before
    bad = CliRunner().invoke(
        app,
        [
            "synthesize",
            "trajectories",
            "--questions",
            str(qfile),
            "--kg",
            str(kb),
            "--out",
            str(tmp_path / "free.parquet"),
            "--mode",
            "free",
        ],
    )
    assert bad.exit_code == 2 and "policy model" in bad.output


class TurnPolicy(LLM):
    """Answers from a per-question script indexed by the turn (stateless, like a model), and
    dies (like Ctrl-C) after ``budget`` requests when a budget is given."""

    backend = "scripted"
    model = "turns"

    def __init__(self, scripts, budget: int | None = None) -> None:
        super().__init__()
        self.scripts = scripts
        self.budget = budget

    def generate_batch(self, requests, progress=None):
        out = []
        for i, r in enumerate(requests):
            if self.budget is not None:
                if self.budget == 0:
                    raise KeyboardInterrupt
                self.budget -= 1
            msgs = r.message_dicts()
            question = msgs[1]["content"].split("\n")[0].removeprefix("Question: ")
            turn = sum(m["role"] == "assistant" for m in msgs)
            c = Completion(self.scripts[question][min(turn, len(self.scripts[question]) - 1)])
            out.append(c)
            if progress:
                progress(i, c)
        return out


def test_interrupted_free_run_resumes_from_the_cache_without_losses(kg, questions, tmp_path):
    from kgsynth.llm.cache import CachedLLM

    rows = questions[:4]

    def script():
        return {
            q["question"]: [
                f'<think>t</think><kg-query>get_relations("{q["topic_names"][0]}")</kg-query>',
                '<think>t</think><answer>["A"]</answer>',
            ]
            for q in rows
        }

    cfg = TrajectoryConfig(mode="free", agent=AgentConfig(max_turns=3))
    full, _, _ = synthesize_trajectories(rows, cfg, graph=KGGraph(kg), llm=TurnPolicy(script()))
    cache = tmp_path / "cache.sqlite"
    with pytest.raises(KeyboardInterrupt):
        synthesize_trajectories(
            rows, cfg, graph=KGGraph(kg), llm=CachedLLM(TurnPolicy(script(), budget=6), cache)
        )
    resumed_llm = CachedLLM(TurnPolicy(script()), cache)
    resumed, _, _ = synthesize_trajectories(rows, cfg, graph=KGGraph(kg), llm=resumed_llm)
    # 4 episodes x 2 turns: the 6 requests answered before the interruption were kept
    assert (resumed_llm.stats.cache_hits, resumed_llm.stats.cache_misses) == (6, 2)
    assert [r["trajectory_id"] for r in resumed] == [r["trajectory_id"] for r in full]
    assert [r["messages"] for r in resumed] == [r["messages"] for r in full]


def test_per_turn_metadata_is_stored(kg):
    graph = KGGraph(kg)
    task = EpisodeTask("Who directed Movie 4?", ["Movie 4"])
    policy = ScriptedPolicy(
        {
            task.question: [
                '<think>a</think><kg-query>get_relations("Nobody")</kg-query>',
                "no think <answer>[]</answer>",
            ]
        }
    )
    from kgsynth.agent.loop import episode_summary

    (ep,) = run_episodes(policy, [task], lambda t: ToolEnvironment(graph, t.question))
    turns = episode_summary(ep)["turns"]
    assert turns[0] == {
        "tool": "get_relations",
        "args": '["Nobody"]',
        "tool_error": "entity_not_found",
        "format_error": None,
        "entities": [],
    }
    assert turns[1]["format_error"] == "missing <think> block" and turns[1]["tool"] is None


def _dee_films(extra: tuple[str, str, str], film: str, language: str) -> tuple:
    """Three films Dee directed, two with a language, plus ``extra``; and the chain-2 row
    "which languages are the films Dee directed in" walked through ``film`` to ``language``."""
    facts = [
        ("Film A", "directed_by", "Dee"),
        ("Film B", "directed_by", "Dee"),
        ("Film C", "directed_by", "Dee"),
        ("Film A", "in_language", "French"),
        ("Film B", "in_language", "Italian"),
        extra,
    ]
    graph = KGGraph(EmbeddedKG.from_ntriples(movie_ntriples(facts), get_profile("generic")))
    row = {
        "question": "which languages are the films Dee directed in",
        "topic_names": ["Dee"],
        "branches": [
            [
                {"relation": "directed_by", "inverse": True, "entity": film},
                {"relation": "in_language", "inverse": False, "entity": language},
            ]
        ],
        "merge_at": [2],
        "answer_names": ["French", "Italian"],
    }
    return graph, row


def test_a_chain_hop_is_followed_from_every_entity_the_previous_hop_reached():
    from kgsynth.synthesize.trajectories import replay

    # Film C has no language: passed over
    graph, row = _dee_films(("Film D", "directed_by", "Eve"), "Film A", "French")
    steps = replay(row, ToolEnvironment(graph, row["question"], ToolConfig()), fan_out=4)
    calls = [c.call for c, _ in steps]
    assert calls == [
        'get_relations("Dee")',
        'get_triples("Dee", ["directed_by"])',
        'get_relations("Film A")',
        'get_triples("Film A", ["in_language"])',
        'get_triples("Film B", ["in_language"])',
    ]
    observed = {e for _, result in steps for e in result.entities}
    assert {"French", "Italian"} <= observed  # the whole answer set, not Film A's part
    # without fan-out (the default) the replay sees only the walked film's answer
    alone = replay(row, ToolEnvironment(graph, row["question"], ToolConfig()))
    assert [c.call for c, _ in alone] == calls[:4]


def test_look_ahead_lists_an_answer_s_relations_before_answering(kg, questions):
    """--look-ahead: after its last hop, each replay lists the relations of the first gold
    answer shown, then answers the same as without it (copied from the hop before)."""
    graph = KGGraph(kg)
    plain, _, _ = synthesize_trajectories(
        questions, TrajectoryConfig(), graph=graph, llm=TemplateLLM()
    )
    ahead, _, _ = synthesize_trajectories(
        questions, TrajectoryConfig(look_ahead=True), graph=graph, llm=TemplateLLM()
    )
    assert [r["question_id"] for r in ahead] == [r["question_id"] for r in plain]
    checked = 0
    for before, after in zip(plain, ahead, strict=True):
        assert after["predicted_answers"] == before["predicted_answers"]
        assert after["tool_calls"][: len(before["tool_calls"])] == before["tool_calls"]
        if len(after["tool_calls"]) == len(before["tool_calls"]) + 1:
            checked += 1
            shown = before["turns"][-2]["entities"]
            gold = {normalize_answer(a) for a in before["gold_answers"]}
            first = next(e for e in shown if normalize_answer(e) in gold)
            assert after["tool_calls"][-1] == f"get_relations({json.dumps(first)})"
            assert after["num_turns"] == before["num_turns"] + 1
    assert checked > len(ahead) * 0.9
    with pytest.raises(ConfigError, match="--look-ahead"):
        TrajectoryConfig(look_ahead=True, mode="free")


def test_the_split_is_part_of_the_config_and_its_manifest(kg, questions, tmp_path):
    import pyarrow as pa
    from typer.testing import CliRunner

    from kgsynth.cli import app
    from kgsynth.core.schema import QUESTION_SCHEMA
    from kgsynth.synthesize.trajectories import split_of

    qfile = tmp_path / "questions.parquet"
    pq.write_table(pa.Table.from_pylist(questions, schema=QUESTION_SCHEMA), qfile)
    kb = tmp_path / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in generated_movie_facts()) + "\n")
    out = tmp_path / "held.parquet"
    args = ["synthesize", "trajectories", "--questions", str(qfile), "--kg", str(kb)]
    res = CliRunner().invoke(
        app, [*args, "--out", str(out), "--split", "heldout", "--heldout-fraction", "0.5"]
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "held.manifest.json").read_text())
    assert manifest["config"]["split"] == "heldout"
    assert manifest["config"]["heldout_fraction"] == 0.5
    held = [q for q in questions if split_of(q["question_id"], 0.5) == "heldout"]
    assert manifest["input"]["rows"] == len(held) < len(questions)
    bad = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x.parquet"), "--split", "dev"])
    assert bad.exit_code == 2 and "--split must be all, train or heldout" in bad.output


def test_reflection_prompt_shapes_the_sample_but_is_not_stored(kg, questions):
    """--reflection: the sampler's system prompt carries the GraphRoll-style reflection text;
    the stored trajectory keeps the plain agent prompt that training, RL and eval use."""
    from kgsynth.agent.loop import system_prompt

    row = next(q for q in questions if q["structure"] == "chain-1")
    plain = system_prompt("graphwalker", 10, "full")
    for mode in ("free", "referenced"):
        policy = ScriptedPolicy({row["question"]: ['<think>ok</think><answer>["x"]</answer>']})
        rows, _, _ = synthesize_trajectories(
            [row], TrajectoryConfig(mode=mode, reflection=True), graph=KGGraph(kg), llm=policy
        )
        seen = policy.prompts[0][0]["content"]
        assert seen.startswith(plain.rstrip("\n")) and "go back to an entity" in seen
        (traj,) = rows
        assert traj["messages"][0] == {"role": "system", "content": plain}
    policy = ScriptedPolicy({row["question"]: ['<think>ok</think><answer>["x"]</answer>']})
    synthesize_trajectories([row], TrajectoryConfig(mode="free"), graph=KGGraph(kg), llm=policy)
    assert policy.prompts[0][0]["content"] == plain  # off by default
    with pytest.raises(ConfigError, match="--reflection"):
        TrajectoryConfig(mode="oracle", reflection=True)


def test_oracle_workers_give_the_one_process_files(tmp_path):
    """--workers 2: two spawned processes replay contiguous shards; the files are byte for
    byte those of one process."""
    import hashlib

    from typer.testing import CliRunner

    from kgsynth.cli import app
    from tests.kgfixtures import build_pipeline_inputs

    paths = build_pipeline_inputs(tmp_path, walks=30, structures="chain-1:0.5,chain-2:0.3,2I:0.2")
    runner = CliRunner()
    digests = []
    for n in (1, 2):
        out = tmp_path / f"t{n}.parquet"
        res = runner.invoke(
            app,
            ["synthesize", "trajectories", "--questions", str(paths["questions"]), "--kg",
             str(paths["store"]), "--mode", "oracle", "--llm", "template", "--out", str(out),
             "--workers", str(n)],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        rejected = out.with_name(f"{out.stem}.rejected.parquet")
        digests.append(
            [hashlib.sha256(p.read_bytes()).hexdigest() for p in (out, rejected) if p.exists()]
        )
    assert digests[0] == digests[1] and digests[0]
    res = runner.invoke(
        app,
        ["synthesize", "trajectories", "--questions", str(paths["questions"]), "--kg",
         str(paths["store"]), "--mode", "oracle", "--llm", "template", "--out",
         str(tmp_path / "bad.parquet"), "--workers", "0"],
    )  # fmt: skip
    assert res.exit_code != 0 and "--workers must be between 1 and 256" in res.output


def test_follow_first_goes_on_from_the_first_shown_entity_that_leads_on():
    from kgsynth.synthesize.trajectories import replay

    # Film C has no language: passed over
    graph, row = _dee_films(("Film C", "has_genre", "Drama"), "Film B", "Italian")
    env = ToolEnvironment(graph, row["question"], ToolConfig())
    steps = replay(row, env, follow="first")
    shown = [e for e in steps[1][1].entities if e != "Dee"]
    first_with_language = next(e for e in shown if e != "Film C")
    assert steps[2][0].call == f'get_relations("{first_with_language}")'
    assert steps[3][0].call == f'get_triples("{first_with_language}", ["in_language"])'
    # walked (the default) goes on from the film the walk passed through
    walked = replay(row, ToolEnvironment(graph, row["question"], ToolConfig()))
    assert walked[3][0].call == 'get_triples("Film B", ["in_language"])'
    with pytest.raises(ConfigError, match="--follow"):
        TrajectoryConfig(follow="last")


def test_oracle_replays_under_the_focus_ranking(kg, questions):
    """The focus ranking marks relation lines with the question words they match; the
    oracle still finds its relation in them, so it keeps every question the bm25 ranking
    keeps. Replayed in order on a fresh environment, its calls give the stored observations
    (the ranking depends on the episode's earlier calls), and after a chain's last hop the
    look-ahead's list marks nothing: the question asks for no more."""
    graph = KGGraph(kg)
    plain, _, _ = synthesize_trajectories(
        questions, TrajectoryConfig(look_ahead=True), graph=graph, llm=TemplateLLM()
    )
    cfg = TrajectoryConfig(look_ahead=True, agent=AgentConfig(relation_ranking="focus"))
    focus, rejected, _ = synthesize_trajectories(questions, cfg, graph=graph, llm=TemplateLLM())
    assert len(focus) >= len(plain) and not [
        r for r in rejected if r["reject_reason"] == "gold_relation_not_retrievable"
    ]
    marked = 0
    by_id = {q["question_id"]: q for q in questions}
    for row in focus:
        env = ToolEnvironment(graph, row["question"], cfg.tool_config())
        tool_msgs = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        for call, obs in zip(row["tool_calls"], tool_msgs, strict=True):
            assert obs == f"<information>{env.execute(call).text}</information>"
        marked += " <- " in tool_msgs[0]
        if by_id[row["question_id"]]["structure"].startswith("chain"):
            assert " <- " not in tool_msgs[-1], (row["question"], tool_msgs[-1])
    assert marked > len(focus) / 2


def test_correct_names_stores_the_name_a_call_was_read_as(kg, questions):
    """Hindsight correction: a rollout that misspelt a name (read as the question's name with
    --entity-matching near) is stored as if the policy had written the KG's name: the same
    messages, calls and turn records as that rollout, except the answer it wrote."""
    row = next(q for q in questions if len(q["topic_names"][0]) >= 8)
    name = row["topic_names"][0]
    typo = name[:3] + name[2:]  # a letter doubled: not in the KG

    def script(written: str) -> dict[str, list[str]]:
        return {
            row["question"]: [
                f"<think>I list the relations of {written}.</think>"
                f'<kg-query>get_relations("{written}")</kg-query>',
                f'<think>Done with {written}.</think><answer>["{typo}"]</answer>',
            ]
        }

    near = dict(mode="free", agent=AgentConfig(max_turns=3, entity_matching="near"))
    kept, _, _ = synthesize_trajectories(
        [row], TrajectoryConfig(**near), graph=KGGraph(kg), llm=TurnPolicy(script(typo))
    )
    fixed, _, stats = synthesize_trajectories(
        [row],
        TrajectoryConfig(**near, correct_names=True),
        graph=KGGraph(kg),
        llm=TurnPolicy(script(typo)),
    )
    exact, _, _ = synthesize_trajectories(
        [row], TrajectoryConfig(**near), graph=KGGraph(kg), llm=TurnPolicy(script(name))
    )
    assert f'read as "{name}"' in kept[0]["messages"][3]["content"]
    assert (stats["names_corrected"], stats["rollouts_corrected"]) == (1, 1)
    (got,), (want,) = fixed, exact
    assert got["messages"][:4] == want["messages"][:4]  # call, reasoning, observation
    assert got["messages"][4]["content"] == (
        f'<think>Done with {name}.</think><answer>["{typo}"]</answer>'  # the answer as written
    )
    assert got["tool_calls"] == want["tool_calls"] and got["turns"] == want["turns"]
    assert got["predicted_answers"] == [typo]
    with pytest.raises(ConfigError, match="--entity-matching near"):
        TrajectoryConfig(mode="free", correct_names=True)
    with pytest.raises(ConfigError, match="--mode free or referenced"):
        TrajectoryConfig(agent=AgentConfig(entity_matching="near"), correct_names=True)


def test_correct_read_names_replaces_whole_names_only():
    from kgsynth.synthesize.name_correction import correct_read_names

    cut = "x" * 77 + "..."
    episode = {
        "messages": [
            {"role": "user", "content": "Question: who starred with Toby Kei"},
            {"role": "assistant", "content": '<kg-query>get_relations("Toby Kei")</kg-query>'},
            {
                "role": "tool",
                "content": '<information>(no entity named "Toby Kei": read as "Toby Keith")\n'
                'Relations of "Toby Keith"</information>',
            },
            {"role": "assistant", "content": "<think>Toby Keith, not Toby Kei.</think>"},
            {"role": "tool", "content": f'(no entity named "{cut}": read as "Y")\nZ'},
        ],
        "tool_calls": ['get_relations("Toby Kei")'],
        "turns": [{"tool": "get_relations", "args": '["Toby Kei"]'}, {"tool": None, "args": None}],
    }
    fixed, removed = correct_read_names(episode)
    assert removed == 1
    assert [m["content"] for m in fixed["messages"]] == [
        "Question: who starred with Toby Kei",  # the question is the question
        '<kg-query>get_relations("Toby Keith")</kg-query>',
        '<information>Relations of "Toby Keith"</information>',
        "<think>Toby Keith, not Toby Keith.</think>",  # "Toby Keith" itself left alone
        f'(no entity named "{cut}": read as "Y")\nZ',  # a cut name cannot be corrected
    ]
    assert fixed["tool_calls"] == ['get_relations("Toby Keith")']
    assert fixed["turns"][0]["args"] == '["Toby Keith"]' and fixed["turns"][1]["args"] is None
    assert correct_read_names({"messages": episode["messages"][:2]}) == (
        {"messages": episode["messages"][:2]},
        0,
    )


def test_a_dead_end_trial_lists_the_films_without_the_next_relation_first():
    """--trial-and-error on the path oracle: before going on from the first film that has a
    language, the demonstration lists the relations of the film shown before it (without
    in_language), and its thought names the dead end; the answers stay the replay's."""
    import random

    from kgsynth.agent.spaces.oracle_call import TRIAL_MODE
    from kgsynth.agent.spaces.registry import space
    from kgsynth.synthesize.trajectories import replay

    graph, row = _dee_films(("Film C", "has_genre", "Drama"), "Film B", "Italian")
    # worded so that the seeded display order shows Film C (no language) first
    row["question"] = "the films directed by Dee are in which languages"
    env = ToolEnvironment(graph, row["question"], ToolConfig())
    steps = replay(row, env, follow="first")
    assert next(e for e in steps[1][1].entities if e != "Dee") == "Film C"
    gw = space("graphwalker")
    tried = gw.trial(row, env, steps, random.Random(0))
    calls = [c.call for c, _ in tried]
    assert calls[:3] == [steps[0][0].call, steps[1][0].call, 'get_relations("Film C")']
    assert calls[3:] == [c.call for c, _ in steps[2:]] and calls[3] == 'get_relations("Film B")'
    assert "in_language" not in tried[2][1].text and "has_genre" in tried[2][1].text
    retry = tried[3][0]
    assert retry.mistake == {
        "kind": "dead_end", "wrong": "Film C", "right": "Film B", "relation": "in_language"
    }  # fmt: skip
    assert gw.thought("relations", "Film B", retry.hop, (), retry.mistake) == (
        "Film C has no in_language: I list the relations of Film B."
    )
    # through the stage: a second, trial trajectory with the same answer
    rows, rejected, _ = synthesize_trajectories(
        [{**row, "question_id": "q1", "structure": "chain-2", "hops": 2}],
        TrajectoryConfig(follow="first", trial_and_error=1.0), graph=graph, llm=TemplateLLM(),
    )  # fmt: skip
    assert not rejected and [r["mode"] for r in rows] == ["oracle", TRIAL_MODE]
    assert rows[1]["tool_calls"] == calls
    assert rows[1]["predicted_answers"] == rows[0]["predicted_answers"]
    assert "Film C has no in_language" in rows[1]["messages"][8]["content"]
    # every film with a language: no hop qualifies
    graph, row = _dee_films(("Film C", "in_language", "German"), "Film B", "Italian")
    env = ToolEnvironment(graph, row["question"], ToolConfig())
    assert gw.trial(row, env, replay(row, env, follow="first"), random.Random(0)) is None
    with pytest.raises(ConfigError, match="graphwalker or kgr1"):
        TrajectoryConfig(agent=AgentConfig(toolset="isp"), trial_and_error=0.5)
