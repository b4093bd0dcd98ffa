"""The reward components that read one rollout: the outcome rewards (``em_strict``, ``hit``,
``f1``, ``fbeta``), ``format``, ``retrieval`` and KG-R1's per-turn reward, with the helpers that
say which turns were queries and what the environment returned. See :mod:`kgsynth.agent.rewards`
for what each one means."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.loop import Episode, TurnRecord
from kgsynth.metrics import (
    answer_set,
    em_strict,
    f1,
    f_beta,
    hit,
    hits_at_1,
    match_predictions,
    normalize_answer,
)

FBETA_EARLY = 0.5
FBETA_LATE = 1.0
TURN_FORMAT_WEIGHT = 0.5
TURN_ACTION_WEIGHT = 0.5
ANSWER_COMPONENTS = ("em_strict", "hit", "hits_at_1", "f1", "fbeta")


@dataclass(frozen=True)
class Gold:
    """What a rollout is scored against."""

    answers: Sequence[str]
    question: str = ""
    topic_names: Sequence[str] = ()
    # a benchmark's answers by id (parallel to ``answers``, None where one has none) and their
    # aliases: a predicted id or alias counts as the answer it names
    answer_ids: Sequence[str | None] = ()
    aliases: Sequence[Sequence[str]] = ()
    # the question's gold SPARQL, where known: ISP's progress reward reads COUNT and
    # superlative questions from it (kgsynth.agent.rewards.distance, ISP-KGR App. F.8)
    sparql: str | None = None


def predicted(episode: Episode, gold: Gold) -> list[str]:
    """The episode's answers, each id or alias of a gold answer replaced by its gold name."""
    return match_predictions(
        episode.predicted_answers, gold.answers, gold_ids=gold.answer_ids, aliases=gold.aliases
    )


# --- helpers ---------------------------------------------------------------------------------


def assistant_turns(episode: Episode) -> list[TurnRecord]:
    """The turns the policy produced text for (an LLM error is no assistant turn)."""
    return [t for t in episode.turns if not t.llm_error]


def _is_query_turn(turn: TurnRecord) -> bool:
    return turn.query is not None and turn.observation is not None


def _norm_arg(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, (list, tuple)):
        # relation lists: the order of the relations does not change the call
        return tuple(sorted((_norm_arg(v) for v in value), key=repr))
    return value


def _query_key(turn: TurnRecord) -> tuple[Any, ...]:
    if turn.tool:
        return (turn.tool, tuple(_norm_arg(a) for a in turn.args))
    return ("", " ".join((turn.query or "").split()))


def _returned_names(turn: TurnRecord) -> list[str]:
    """Entity names a successful observation returned, the call's own subject excluded: the
    environment echoing a name the model wrote (a guess) is no evidence of anything."""
    if not _is_query_turn(turn) or turn.tool_error is not None:
        return []
    subject = (
        normalize_answer(turn.args[0]) if turn.args and isinstance(turn.args[0], str) else None
    )
    return [e for e in turn.entities if normalize_answer(e) != subject]


def _retrieved(turn: TurnRecord) -> set[str]:
    """Normalized names a successful observation returned, the call's own subject excluded."""
    return answer_set(_returned_names(turn))


# --- outcome components ----------------------------------------------------------------------


def em_strict_reward(episode: Episode, gold: Gold) -> float:
    """The predicted answer set equals the gold set."""
    return em_strict(predicted(episode, gold), gold.answers)


def hit_reward(episode: Episode, gold: Gold) -> float:
    """GraphWalker's EM: some predicted answer is gold."""
    return hit(predicted(episode, gold), gold.answers)


def hits_at_1_reward(episode: Episode, gold: Gold) -> float:
    """The first predicted answer is gold: what Hits@1 counts (F1 also pays for the rest of
    the list; benchmarks/README.md, "GRPO that adds?")."""
    return hits_at_1(predicted(episode, gold), gold.answers)


def f1_reward(episode: Episode, gold: Gold) -> float:
    """KBQA-R1 / ISP: set F1 of the predicted answers."""
    return f1(predicted(episode, gold), gold.answers)


def fbeta_reward(episode: Episode, gold: Gold, beta: float = FBETA_LATE) -> float:
    """KnowCoder-A1: set F-beta (the curriculum picks ``beta``, see :meth:`RewardSpec.fbeta_beta`)."""
    return f_beta(predicted(episode, gold), gold.answers, beta)


def format_reward(episode: Episode, gold: Gold) -> float:
    """1.0 when the episode answered and every assistant turn was well-formed."""
    turns = assistant_turns(episode)
    if not episode.answered or len(turns) != len(episode.turns):
        return 0.0
    return float(all(t.format_error is None for t in turns))


def retrieval_reward(episode: Episode, gold: Gold) -> float:
    """KG-R1 global retrieval reward: a gold answer was returned by the environment."""
    wanted = answer_set(gold.answers)
    return float(any(_retrieved(t) & wanted for t in assistant_turns(episode)))


def turn_rewards_kgr1(episode: Episode, gold: Gold) -> list[float]:
    """KG-R1 per-turn reward: format and action validity; a repeated query earns 0."""
    seen: set[tuple[Any, ...]] = set()
    out: list[float] = []
    for t in assistant_turns(episode):
        format_ok = float(t.format_error is None)
        if t.query is not None:
            key = _query_key(t)
            if key in seen:
                out.append(0.0)
                continue
            seen.add(key)
            action_ok = float(_is_query_turn(t) and t.tool_error is None)
        else:
            action_ok = float(t.action == "answer")
        out.append(TURN_FORMAT_WEIGHT * format_ok + TURN_ACTION_WEIGHT * action_ok)
    return out


def turn_reward(episode: Episode, gold: Gold) -> float:
    """The mean KG-R1 turn reward over assistant turns (0.0 with none)."""
    values = turn_rewards_kgr1(episode, gold)
    return sum(values) / len(values) if values else 0.0
