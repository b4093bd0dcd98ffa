"""Rewards: every component and preset on hand-made and environment-run episodes, exactly."""

import math

import pytest

from kgsynth.agent.loop import Episode, EpisodeTask, TurnRecord, step
from kgsynth.agent.rewards import (
    PRESETS,
    REWARDS,
    TURN_REWARDS,
    Gold,
    GraphDistance,
    RewardSpec,
    RewardState,
    distance_progress,
    pooled_turn_advantages,
    turn_returns,
)
from kgsynth.agent.tools import ErrorType, ToolEnvironment
from kgsynth.core.errors import ConfigError
from kgsynth.kg.graph import KGGraph
from tests.kgfixtures import movie_kg

# "Who directed the movies Bette Davis starred in?" on the movie fixture KG
GOLD = Gold(
    answers=["William Dieterle", "William Wyler"],
    question="Who directed the movies Bette Davis starred in?",
    topic_names=["Bette Davis"],
)


@pytest.fixture(scope="module")
def graph():
    return KGGraph(movie_kg())


def query(q, *, tool="get_relations", args=("X",), entities=("X",), error=None, fmt=None):
    """A query turn the way :func:`step` records it."""
    return TurnRecord(
        f"<think>t</think><kg-query>{q}</kg-query>",
        "t",
        "kg-query",
        q,
        tool=tool,
        args=args,
        format_error=fmt,
        tool_error=error,
        observation="Error" if error else "obs",
        entities=() if error else entities,
    )


def answer(names, *, fmt=None):
    return TurnRecord(f"<answer>{names}</answer>", "t", "answer", None, format_error=fmt)


def episode(turns, predicted=None):
    ep = Episode(EpisodeTask(GOLD.question, list(GOLD.topic_names)), turns=list(turns))
    if predicted is not None:
        ep.predicted_answers = list(predicted)
        ep.answered = True
        ep.done = True
    return ep


def run(graph, texts, gold=GOLD):
    """Apply model texts through the real agent step and tool environment."""
    ep = Episode(EpisodeTask(gold.question, list(gold.topic_names)))
    env = ToolEnvironment(graph, gold.question)
    for text in texts:
        step(ep, env, text, None, final=False)
    return ep


# --- outcome components ----------------------------------------------------------------------


def test_answer_components_exact():
    partial = episode([answer('["William Dieterle"]')], ["william dieterle"])  # p=1, r=1/2
    assert REWARDS["em_strict"](partial, GOLD) == 0.0
    assert REWARDS["f1"](partial, GOLD) == pytest.approx(2 / 3)
    assert REWARDS["fbeta"](partial, GOLD, beta=0.5) == pytest.approx(5 / 6)
    assert REWARDS["fbeta"](partial, GOLD, beta=1.0) == pytest.approx(2 / 3)
    full = episode([answer("...")], ["The William Wyler", "William Dieterle"])
    assert REWARDS["em_strict"](full, GOLD) == 1.0
    assert REWARDS["f1"](full, GOLD) == 1.0
    # Hits@1's reward looks at the first answer only
    first_wrong = episode([answer("...")], ["Casablanca", "William Dieterle"])
    assert REWARDS["hit"](first_wrong, GOLD) == 1.0
    assert REWARDS["hits_at_1"](first_wrong, GOLD) == 0.0
    assert REWARDS["hits_at_1"](full, GOLD) == 1.0
    unanswered = episode([query('get_relations("X")')])
    assert [REWARDS[n](unanswered, GOLD) for n in ("em_strict", "hit", "f1", "fbeta")] == [
        0.0,
        0.0,
        0.0,
        0.0,
    ]


def test_format_reward():
    good = [query('get_relations("X")'), answer("[]")]
    assert REWARDS["format"](episode(good, ["A"]), GOLD) == 1.0
    bad_turn = [query('get_relations("X")', fmt="missing <think> block"), answer("[]")]
    assert REWARDS["format"](episode(bad_turn, ["A"]), GOLD) == 0.0
    assert REWARDS["format"](episode(good[:1]), GOLD) == 0.0  # never answered
    llm_failed = [*good[:1], TurnRecord("", None, None, None, llm_error="timeout")]
    assert REWARDS["format"](episode(llm_failed), GOLD) == 0.0


# --- retrieval -------------------------------------------------------------------------------


def test_fabricated_information_earns_no_retrieval(graph):
    gold = Gold(["William Dieterle"], "Who directed Juarez?", ["Juarez"])
    ep = run(
        graph,
        [
            "<think>I already know.</think><information>(Juarez, directed_by, William Dieterle)"
            '</information><kg-query>get_relations("Juarez")</kg-query>',
            '<think>done</think><information>William Dieterle</information><answer>["William '
            'Dieterle"]</answer>',
        ],
        gold,
    )
    assert "William Dieterle" in ep.turns[0].text  # the model wrote the answer itself
    assert ep.turns[0].tool_error is None and ep.turns[0].entities == ("Juarez",)
    assert REWARDS["em_strict"](ep, gold) == 1.0
    assert REWARDS["retrieval"](ep, gold) == 0.0
    assert RewardSpec.parse("hit:1,retrieval:0.5").score(ep, gold).total == 1.0


def test_retrieval_needs_the_environment_to_return_the_answer(graph):
    gold = Gold(["William Dieterle"], "Who directed Juarez?", ["Juarez"])
    found = run(
        graph, ['<think>a</think><kg-query>get_triples("Juarez", ["directed_by"])</kg-query>']
    )
    assert "William Dieterle" in found.turns[0].entities
    assert REWARDS["retrieval"](found, gold) == 1.0
    # naming a guessed answer in a call: the environment only echoes it back
    guessed = run(graph, ['<think>a</think><kg-query>get_relations("William Dieterle")</kg-query>'])
    assert guessed.turns[0].tool_error is None
    assert guessed.turns[0].entities == ("William Dieterle",)
    assert REWARDS["retrieval"](guessed, gold) == 0.0
    # an error observation names nothing, whatever the call text says
    failed = run(
        graph, ['<think>a</think><kg-query>get_triples("William Dieterle", ["nope"])</kg-query>']
    )
    assert failed.turns[0].tool_error == ErrorType.RELATION_NOT_FOUND.value
    assert REWARDS["retrieval"](failed, gold) == 0.0
    # only a successful observation counts, whatever names a record carries
    errored = query("q", args=("Juarez",), error=ErrorType.TIMEOUT.value)
    errored.entities = ("William Dieterle",)
    assert REWARDS["retrieval"](episode([errored]), gold) == 0.0
    errored.tool_error = None
    assert REWARDS["retrieval"](episode([errored]), gold) == 1.0


# --- KG-R1 turn-level rewards ----------------------------------------------------------------


def test_turn_rewards_per_turn_and_repeats():
    turns = [
        query('get_relations("Kismet")', args=("Kismet",)),  # valid: 1
        query('get_relations( "kismet" )', args=(" kismet ",)),  # repeat: 0
        query(
            "get_triples('Nobody', ['r'])",
            tool="get_triples",
            args=("Nobody", ("r",)),
            error=ErrorType.ENTITY_NOT_FOUND.value,
        ),  # fmt ok, failed: 0.5
        query(
            "get_triples('Nobody', ['r'])",
            tool="get_triples",
            args=("Nobody", ("r",)),
            error=ErrorType.ENTITY_NOT_FOUND.value,
        ),  # a repeated failure: 0
        query(
            "get_triples('Kismet', ['a', 'b'])",
            tool="get_triples",
            args=("Kismet", ("a", "b")),
            fmt="missing <think> block",
        ),  # valid, bad format: 0.5
        query(
            "get_triples('Kismet', ['b', 'a'])", tool="get_triples", args=("Kismet", ("b", "a"))
        ),  # same relations: repeat, 0
        TurnRecord("rambling", None, None, None, format_error="no action"),  # 0
        query("get_relations(Kismet", tool=None, args=(), error=ErrorType.BAD_SYNTAX.value),  # 0.5
        query("get_relations(Kismet", tool=None, args=(), error=ErrorType.BAD_SYNTAX.value),  # 0
        answer('["A"]'),  # 1
    ]
    ep = episode(turns, ["A"])
    expected = [1.0, 0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 0.5, 0.0, 1.0]
    assert TURN_REWARDS["turn"](ep, GOLD) == expected
    assert REWARDS["turn"](ep, GOLD) == pytest.approx(3.5 / 10)
    res = RewardSpec.parse("em_strict:1,turn:0.2").score(ep, GOLD)
    assert res.turn_rewards == pytest.approx([0.2 * v for v in expected])
    assert res.components == {"em_strict": 0.0, "turn": pytest.approx(0.35)}
    assert res.total == pytest.approx(0.07)


def test_repeated_query_through_the_environment(graph):
    ep = run(
        graph,
        [
            '<think>a</think><kg-query>get_relations("Bette Davis")</kg-query>',
            "<think>b</think><kg-query>get_relations( 'bette davis' )</kg-query>",
            '<think>c</think><answer>["William Wyler"]</answer>',
        ],
    )
    assert [t.tool_error for t in ep.turns] == [None, None, None]
    assert TURN_REWARDS["turn"](ep, GOLD) == [1.0, 0.0, 1.0]


def test_llm_error_turn_is_no_assistant_turn():
    ep = episode([query('get_relations("X")'), TurnRecord("", None, None, None, llm_error="500")])
    res = RewardSpec.parse("turn").score(ep, GOLD)
    assert res.turn_rewards == [1.0]
    assert RewardSpec.parse("hit").score(ep, GOLD).turn_rewards == [0.0]


def test_kgr1_turn_returns_and_pooled_advantages_hand_computed():
    # KG-R1: G_t = r_t + lambda * R. Rollout a: turn rewards [1, 0.5], R = 1; rollout b:
    # [0], R = 0; rollout c: no turn. lambda = 0.5 -> G: a [1.5, 1.0], b [0.0], c [].
    returns = [turn_returns([1.0, 0.5], 1.0, 0.5), turn_returns([0.0], 0.0, 0.5), []]
    assert returns == [[1.5, 1.0], [0.0], []]
    # one baseline pooled over the three turns: mean 2.5 / 3, population std
    # sqrt(((1.5 - m)^2 + (1 - m)^2 + m^2) / 3)
    m = 2.5 / 3
    sd = math.sqrt(((1.5 - m) ** 2 + (1.0 - m) ** 2 + m**2) / 3)
    adv = pooled_turn_advantages(returns, eps=0.0)
    assert adv[0] == pytest.approx([(1.5 - m) / sd, (1.0 - m) / sd])
    assert adv[1] == pytest.approx([-m / sd]) and adv[2] == []
    # without std scaling (r - mean): the same baseline, no division
    assert pooled_turn_advantages(returns, scale=False)[0] == pytest.approx([1.5 - m, 1.0 - m])
    # not normalized per turn index: a rollout's second turn shares the baseline of all turns
    flat = pooled_turn_advantages([[1.0, 3.0], [1.0]], eps=0.0, scale=False)
    assert flat[0] == pytest.approx([-2 / 3, 4 / 3]) and flat[1] == pytest.approx([-2 / 3])
    assert pooled_turn_advantages([[], []]) == [[], []]


# --- presets: gating, cap, curriculum --------------------------------------------------------


def test_presets_parse_to_their_components():
    assert str(RewardSpec.parse("graphwalker")) == "hit:1"
    assert RewardSpec.parse("graphwalker") == RewardSpec.parse("hit")
    assert RewardSpec.parse("KBQA-R1") == RewardSpec.parse("f1:1,format:0.1", gate_format=True)
    assert RewardSpec.parse("knowcoder-a1") == RewardSpec.parse("fbeta,format:0.1", cap=1.0)
    # KG-R1 v2 App. D Table 8; ISP-KGR's reward_fn.py (0.1 format + 0.3 progress + 0.6 F1)
    assert str(RewardSpec.parse("kg-r1")) == "f1:1,retrieval:1,turn:1"
    assert str(RewardSpec.parse("isp")) == "f1:0.6,distance:0.3,format:0.1"
    assert RewardSpec.parse("isp").needs_distance
    assert not any(RewardSpec.parse(p).needs_distance for p in PRESETS if p != "isp")
    assert RewardSpec() == RewardSpec.parse("graphwalker")


def test_kbqa_r1_format_only_with_a_positive_outcome():
    spec = RewardSpec.parse("kbqa-r1")
    turns = [query('get_relations("X")'), answer("[]")]
    right = spec.score(episode(turns, ["William Dieterle"]), GOLD)
    assert right.components == {"f1": pytest.approx(2 / 3), "format": 1.0}
    assert right.total == pytest.approx(2 / 3 + 0.1)
    wrong = spec.score(episode(turns, ["Kismet"]), GOLD)
    assert wrong.components == {"f1": 0.0, "format": 1.0}  # still logged
    assert wrong.total == 0.0
    ungated = RewardSpec.parse("f1:1,format:0.1").score(episode(turns, ["Kismet"]), GOLD)
    assert ungated.total == pytest.approx(0.1)


def test_knowcoder_a1_cap_at_one():
    spec = RewardSpec.parse("knowcoder-a1")
    turns = [answer("[]")]
    full = spec.score(episode(turns, ["William Wyler", "William Dieterle"]), GOLD, RewardState())
    assert full.components == {"fbeta": 1.0, "format": 1.0}
    assert full.total == 1.0
    partial = spec.score(episode(turns, ["William Dieterle"]), GOLD, RewardState())
    assert partial.total == pytest.approx(5 / 6 + 0.1)
    uncapped = RewardSpec.parse("fbeta:1,format:0.1").score(
        episode(turns, ["William Wyler", "William Dieterle"]), GOLD
    )
    assert uncapped.total == pytest.approx(1.1)


@pytest.mark.parametrize(
    ("step", "mean", "switched_at", "beta"),
    [
        (0, None, None, 0.5),
        (99, 0.79, None, 0.5),
        (100, None, None, 1.0),  # the step switch
        (5, 0.2, 3, 1.0),  # switched at step 3: stays switched, whatever the mean now
        (500, 0.0, None, 1.0),
    ],
)
def test_fbeta_curriculum(step, mean, switched_at, beta):
    spec = RewardSpec.parse("fbeta:1", fbeta_switch_step=100, fbeta_switch_reward=0.8)
    state = RewardState(step, mean, switched_at)
    res = spec.score(episode([answer("[]")], ["William Dieterle"]), GOLD, state)
    assert res.fbeta_beta == beta
    # P 1, R 1/2: F0.5 = 1.25 * 0.5 / (0.25 + 0.5) = 5/6, F1 = 2/3
    assert res.components["fbeta"] == pytest.approx(5 / 6 if beta == 0.5 else 2 / 3)
    assert res.outcome == res.components["fbeta"]


def test_fbeta_switch_reads_the_outcome_mean_and_is_monotone():
    spec = RewardSpec.parse("knowcoder-a1")  # switch once the outcome's running mean >= 0.5
    s0 = RewardState()
    s1 = spec.advance(s0, [0.4, 0.4])  # first step: the mean is the step's mean
    assert (s1.step, s1.outcome_mean, s1.fbeta_switched_at) == (1, 0.4, None)
    assert spec.fbeta_beta(s1) == 0.5
    s2 = spec.advance(s1, [1.0, 1.0])  # 0.9 * 0.4 + 0.1 * 1.0 = 0.46: not yet
    assert s2.outcome_mean == pytest.approx(0.46) and s2.fbeta_switched_at is None
    s3 = spec.advance(s2, [1.0])  # 0.9 * 0.46 + 0.1 = 0.514: switched from step 3 on
    assert s3.outcome_mean == pytest.approx(0.514) and s3.fbeta_switched_at == 3
    assert spec.fbeta_beta(s3) == 1.0
    s4 = spec.advance(s3, [0.0, 0.0])  # the mean falls back under 0.5: beta stays 1
    assert s4.outcome_mean < 0.5 and spec.fbeta_beta(s4) == 1.0 and s4.fbeta_switched_at == 3
    # a step switch is recorded at the step it came
    by_step = RewardSpec.parse("fbeta", fbeta_switch_reward=2.0, fbeta_switch_step=2)
    state = RewardState()
    for _ in range(4):
        state = by_step.advance(state, [0.0])
    assert state.fbeta_switched_at == 2 and by_step.fbeta_beta(state) == 1.0
    never = RewardSpec.parse("fbeta", fbeta_switch_reward=2.0)  # a level above 1: no switch
    assert never.fbeta_beta(never.advance(RewardState(10**6, 1.0), [1.0])) == 0.5
    # without an fbeta component nothing switches
    assert RewardSpec.parse("f1").advance(s3, [1.0]).fbeta_switched_at == 3
    assert RewardSpec.parse("f1").advance(s0, [1.0]).fbeta_switched_at is None


# --- ISP distance progress -------------------------------------------------------------------


def test_graph_distance_on_the_fixture_kg(graph):
    gd = GraphDistance(graph)
    answers = GOLD.answers
    assert gd.distance(["William Wyler"], answers) == 0
    assert gd.distance(["william dieterle"], answers) == 0
    assert gd.distance(["Jezebel"], answers) == 1
    assert gd.distance(["Kismet", "Bette Davis"], answers) == 1
    assert gd.distance(["Bette Davis"], answers) == 2  # Bette Davis <- Juarez -> Dieterle
    assert gd.distance(["1944"], answers) == 2
    assert gd.distance(["Nobody Here"], answers) is None
    assert gd.field(answers) is gd.field(list(reversed(answers)))  # cached per gold set
    assert GraphDistance(graph, max_depth=1).distance(["Bette Davis"], answers) is None
    assert gd.with_answers(["Ronald Colman"]).distance(["Marlene Dietrich"]) == 2
    with pytest.raises(ValueError):
        gd.distance(["Kismet"])


def test_distance_reward_on_the_fixture_kg(graph):
    ep = run(
        graph,
        [
            '<think>a</think><kg-query>get_relations("Bette Davis")</kg-query>',  # 2: 0
            '<think>b</think><kg-query>get_triples("Bette Davis", ["starred_actors"])</kg-query>',
            '<think>c</think><kg-query>get_relations("Nobody Here")</kg-query>',  # error: -1
            '<think>d</think><kg-query>get_triples("Jezebel", ["directed_by"])</kg-query>',
            '<think>e</think><answer>["William Wyler", "William Dieterle"]</answer>',
        ],
    )
    assert set(ep.turns[1].entities) == {"Bette Davis", "Jezebel", "Juarez"}  # distance 1: +1
    assert set(ep.turns[3].entities) == {"Jezebel", "William Wyler"}  # distance 0: +1
    gd = GraphDistance(graph)
    assert distance_progress(ep, GOLD, gd) == [0.0, 1.0, -1.0, 1.0, 0.0]
    assert REWARDS["distance"](ep, GOLD, distance=gd) == pytest.approx(0.25)
    res = RewardSpec.parse("isp").score(ep, GOLD, RewardState(), distance=gd)
    assert res.components == {"f1": 1.0, "distance": pytest.approx(0.25), "format": 1.0}
    assert res.total == pytest.approx(0.6 * 1.0 + 0.3 * 0.25 + 0.1 * 1.0)
    with pytest.raises(ConfigError, match="GraphDistance"):
        RewardSpec.parse("isp").score(ep, GOLD)
    # beyond the search bound the topic's distance is unknown: any known distance is progress
    near = GraphDistance(graph, max_depth=1)
    assert distance_progress(ep, GOLD, near) == [0.0, 1.0, -1.0, 1.0, 0.0]
    none_seen = GraphDistance(graph, max_depth=0)
    assert distance_progress(ep, GOLD, none_seen) == [0.0, 0.0, -1.0, 1.0, 0.0]


def test_distance_empty_observation_and_no_queries(graph):
    gd = GraphDistance(graph)
    empty = query('get_relations("X")', entities=())  # no entity returned: no progress, no error
    unrun = TurnRecord("<kg-query>q</kg-query>", None, "kg-query", "q")  # the forced final turn
    errored = query('get_triples("Y")', error=ErrorType.TIMEOUT.value)
    errored.entities = ("William Wyler",)  # an error is -1 whatever the record names
    ep = episode([empty, unrun, errored, answer("[]")], ["A"])
    assert distance_progress(ep, GOLD, gd) == [0.0, 0.0, -1.0, 0.0]
    assert REWARDS["distance"](ep, GOLD, distance=gd) == -0.5  # mean over the 2 queries run
    assert REWARDS["distance"](episode([answer("[]")], ["A"]), GOLD, distance=gd) == 0.0


def test_distance_gives_no_credit_for_echoed_guesses_and_punishes_repeats(graph):
    # the trick the old reward paid for: name the answer yourself, let the environment echo it
    ep = run(
        graph,
        [
            '<think>guess</think><kg-query>get_relations("William Wyler")</kg-query>',
            '<think>again</think><kg-query>get_relations("william wyler")</kg-query>',
            '<think>a</think><kg-query>get_triples("Bette Davis", ["starred_actors"])</kg-query>',
            '<think>b</think><kg-query>get_triples("Bette Davis", ["starred_actors"])</kg-query>',
            '<think>e</think><answer>["William Wyler"]</answer>',
        ],
    )
    assert ep.turns[0].entities == ("William Wyler",) and ep.turns[0].tool_error is None
    gd = GraphDistance(graph)
    # guess echoed: 0; the same call again: -1; films reached (distance 1 < 2): +1; repeat: -1
    assert distance_progress(ep, GOLD, gd) == [0.0, -1.0, 1.0, -1.0, 0.0]


# --- the registry ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "opts", "needle"),
    [
        ("hit,bogus:1", {}, "'bogus'"),
        ("graphwalkr", {}, "'graphwalkr'"),
        ("hit:abc", {}, "not a number"),
        ("hit:nan", {}, "finite"),
        ("hit,hit:0.5", {}, "more than once"),
        ("hit,,f1", {}, "empty component"),
        ("", {}, "empty component"),
        ("format:0.1", {"gate_format": True}, "gate_format"),
        ("hit", {"cap": -1.0}, "cap"),
        ("fbeta", {"fbeta_switch_step": -1}, "fbeta_switch_step"),
    ],
)
def test_spec_errors(text, opts, needle):
    with pytest.raises(ConfigError) as err:
        RewardSpec.parse(text, **opts)
    assert needle in str(err.value)


def test_unknown_component_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        RewardSpec.parse("hit,bogus")
    message = str(err.value)
    for name in [*REWARDS, *PRESETS]:
        assert name in message
