"""The template backend's questions: a walk (chain, 2I, IP or PI) put into English from its
topic names and relation names only, intermediate entities never mentioned.

Questions come from paraphrase families (model ``rules-v3``): each hop of a walk picks one of
several English forms for its relation and direction ("the genre of X", "X's genre", "the
things X starred in", "the one X was directed by", …), conjunctions pick one way of saying
"both", and a question frame ("What is …?", "Name …?", "Who was X directed by?", …) goes
around the result. The forms are built only from the KG's own relation names (through
:func:`~kgsynth.llm.relation_forms.relation_words`), so they work on any KG, and the draw is
seeded by the generation seed and the walk id (:func:`walk_rng`): the same seed gives the same
file. ``path_question(row)`` without an rng still gives the single canonical form of
``rules-v1``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.kg.relnames import relation_parts
from kgsynth.llm.relation_forms import (
    Phrase,
    hop_forms,
    hop_gaps,
    hop_predicates,
    relation_form,
    relation_words,
)

# --- the canonical form (rules-v1) ----------------------------------------------------------


def hop_phrase(noun_phrase: str, relation: str, inverse: bool) -> str:
    """A noun phrase for what is one hop from ``noun_phrase``.

    Forward ``X r ?``: "the genre of X"; forward ``X directed_by ?``: "the one X was
    directed by". Inverse ``? r X``: "the things whose genre is X" / "the things directed by X".
    """
    words = relation_words(relation)
    passive = relation_parts(relation).property.endswith("_by") or words.endswith(" by")
    if passive:
        return (
            f"the things {words} {noun_phrase}" if inverse else f"the one {noun_phrase} was {words}"
        )
    if inverse:
        verb = "include" if words.endswith("s") else "is"
        return f"the things whose {words} {verb} {noun_phrase}"
    return f"the {words} of {noun_phrase}"


def branch_phrase(topic: str, hops: Sequence[dict[str, Any]]) -> str:
    """The canonical noun phrase for the end of ``hops`` walked from ``topic``."""
    phrase = topic
    for hop in hops:
        phrase = hop_phrase(phrase, hop["relation"], bool(hop["inverse"]))
    return phrase


def _canonical_question(row: dict[str, Any]) -> str:
    topics, branches, merge_at = row["topic_names"], row["branches"], row["merge_at"]
    if len(branches) == 1:
        phrase = branch_phrase(topics[0], branches[0])
        return f"{'What are' if phrase.startswith('the things') else 'What is'} {phrase}?"
    first = branch_phrase(topics[0], branches[0][: merge_at[0]])
    second = branch_phrase(topics[1], branches[1][: merge_at[1]])
    meet = f"the one that is both {first} and {second}"
    tail = branches[0][merge_at[0] :]
    if not tail:
        return f"What is both {first} and {second}?"
    phrase = branch_phrase(meet, tail)
    return f"{'What are' if phrase.startswith('the things') else 'What is'} {phrase}?"


_SINGULAR_FRAMES = ("What is {}", "Who or what is {}", "Name {}", "Tell me {}")
_PLURAL_FRAMES = ("What are {}", "Which are {}", "Name {}", "Tell me {}", "List {}")
_CLAUSE_FRAMES = ("Tell me {}", "Can you tell me {}", "Do you know {}")


def _sentence(text: str, rng: random.Random) -> str:
    """A question from a frame's text: capitalized, or all lowercase at its start as people
    type it (one '?' either way: the parser of the question stage asks for one)."""
    head = text[0].lower() if rng.random() < 0.3 else text[0].upper()
    return f"{head}{text[1:]}?"


def frame_question(phrase: Phrase, rng: random.Random) -> str:
    """Put a question frame around a top-level phrase."""
    if phrase.role == "direct":
        return _sentence(phrase.text, rng)
    if phrase.role in ("wh", "free"):
        frames: tuple[str, ...] = _CLAUSE_FRAMES
    elif phrase.plural:
        frames = _PLURAL_FRAMES
    else:
        frames = _SINGULAR_FRAMES + (("Who is {}",) if phrase.agent else ())
    return _sentence(rng.choice(frames).format(phrase.text), rng)


def _needs_subject(hop: dict[str, Any] | None) -> bool:
    """True when ``hop``'s forms put the phrase before it in subject position ("the one X was
    directed by"), where a free relative ("what Y directed") cannot stand."""
    if hop is None or hop["inverse"]:
        return False
    return relation_form(hop["relation"]).kind in ("passive", "relational")


def _pick(forms: Sequence[Phrase], next_hop: dict[str, Any] | None, rng: random.Random) -> Phrase:
    """A nestable form that the next hop (if any) can build on."""
    subject = _needs_subject(next_hop)
    return rng.choice([f for f in forms if f.nestable and (f.subject_ok or not subject)])


@dataclass(frozen=True)
class Side:
    """One branch of a conjunction up to where the branches meet: a nestable phrase for the
    meeting point, and the predicates and gap clauses its last hop allows."""

    phrase: Phrase
    predicates: tuple[tuple[str, str], ...] = ()
    gaps: tuple[str, ...] = ()
    agent: bool = False  # the gap clauses leave out whoever did something


def _walk_hops(
    phrase: Phrase,
    hops: Sequence[dict[str, Any]],
    after: dict[str, Any] | None,
    rng: random.Random,
) -> Side:
    """A nestable phrase for the end of ``hops`` from ``phrase`` (``after`` is the hop that
    will follow, if any), with the predicates and gap clauses of the last hop."""
    side = Side(phrase)
    for i, hop in enumerate(hops):
        relation, inverse = hop["relation"], bool(hop["inverse"])
        following = hops[i + 1] if i + 1 < len(hops) else after
        prev = side.phrase
        side = Side(
            _pick(hop_forms(prev, relation, inverse), following, rng),
            tuple(hop_predicates(prev, relation, inverse)),
            tuple(hop_gaps(prev, relation, inverse)),
            agent=not inverse and relation_form(relation).kind == "passive",
        )
    return side


def conjunction_forms(
    a: Side,
    b: Side,
    pa: tuple[str, str] | None = None,
    pb: tuple[str, str] | None = None,
    ga: str | None = None,
    gb: str | None = None,
) -> list[Phrase]:
    """Ways to say "what is both ``a`` and ``b``" (``pa``/``pb``: a predicate of each side,
    ``ga``/``gb``: a gap clause of each side, where they have one)."""
    x, y = a.phrase, b.phrase
    both = f"both {x.text} and {y.text}"
    out = [
        Phrase(f"the one that is {both}"),
        Phrase(f"the thing that is {both}"),
        Phrase(f"what is {both}", "free"),
        Phrase(f"what is {both}", "direct"),
    ]
    if x.plural and y.plural:
        out.append(Phrase(f"which things are {both}", "direct"))
    if x.agent and y.agent:
        out.append(Phrase(f"who is {both}", "direct"))
    if x.role == "np" and not x.plural:  # not "what is what …"
        out.append(Phrase(f"what is {x.text} and also {y.text}", "direct"))
    if pa and pb:
        out += [
            Phrase(f"the one that {pa[0]} and {pb[0]}"),
            Phrase(f"the things that {pa[1]} and {pb[1]}", plural=True),
            Phrase(f"what {pa[0]} and {pb[0]}", "free"),
            Phrase(f"what {pa[0]} and {pb[0]}", "direct"),
            Phrase(f"which things {pa[1]} and {pb[1]}", "direct"),
        ]
    if ga and gb:
        agent = a.agent and b.agent
        out += [
            Phrase(f"the one {ga} and {gb}", agent=agent),
            Phrase(f"{'who' if agent else 'what'} {ga} and {gb}", "wh", agent=agent),
        ]
    if x.plural and x.role == "np":
        out.append(Phrase(f"among {x.text}, which are also {y.text}", "direct"))
        if pb:
            out += [
                Phrase(f"those among {x.text} that {pb[1]}", plural=True),
                Phrase(f"which of {x.text} {pb[1]}", "direct"),
                Phrase(f"among {x.text}, which {pb[1]}", "direct"),
            ]
    return out


def shared_forms(topic: str, first: dict[str, Any], second: dict[str, Any]) -> list[Phrase]:
    """Forms for two hops that go out along a relation and back along the same one (X r Y,
    ? r Y: what has the same Y as X; Y r X, Y r ?: what shares a Y with X), read from the
    relation's words alone. Empty when the two hops are not such a pair."""
    if first["relation"] != second["relation"] or bool(first["inverse"]) == bool(second["inverse"]):
        return []
    form = relation_form(first["relation"])
    words = form.words
    if not first["inverse"]:  # X r Y, then ? r Y: the things with X's Y
        if form.kind == "passive":
            return [
                Phrase(f"the things {words} the same one as {topic}", plural=True),
                Phrase(f"the ones that were {words} whoever {topic} was {words}", plural=True),
            ]
        if form.kind == "relational":
            return []
        return [
            Phrase(f"the things with the same {words} as {topic}", plural=True),
            Phrase(f"the things that share {words} with {topic}", plural=True),
            Phrase(f"the ones sharing {words} with {topic}", plural=True),
        ]
    # Y r X, then Y r ?: what stands in the same relation to a shared Y
    if form.kind == "participle_noun":
        return [
            Phrase(
                f"the {form.noun} who {form.participle} in the same things as {topic}",
                plural=True,
            ),
            Phrase(f"the {form.noun} sharing things with {topic}", plural=True),
        ]
    if form.kind == "passive":
        return [Phrase(f"the ones who {form.participle} things together with {topic}", plural=True)]
    return [Phrase(f"the {words} that share things with {topic}", plural=True)]


def paraphrase_question(row: dict[str, Any], rng: random.Random) -> str:
    """A question for a walk (chain, 2I, IP or PI), its forms drawn from ``rng``."""
    topics, branches, merge_at = row["topic_names"], row["branches"], row["merge_at"]
    if len(branches) == 1:
        hops = list(branches[0])
        shared = shared_forms(topics[0], hops[0], hops[1]) if len(hops) >= 2 else []
        if shared and rng.random() < 0.5:
            phrase = rng.choice(shared)
            if len(hops) == 2:
                return frame_question(phrase, rng)
            *inner, last = hops[2:]
            phrase = _walk_hops(phrase, inner, last, rng).phrase
            forms = hop_forms(phrase, last["relation"], bool(last["inverse"]))
            return frame_question(rng.choice([f for f in forms if f.top]), rng)
        *inner, last = branches[0]
        phrase = _walk_hops(Phrase(topics[0], "name"), inner, last, rng).phrase
    else:
        sides = [
            _walk_hops(Phrase(topic, "name"), hops[:merge], None, rng)
            for topic, hops, merge in zip(topics, branches, merge_at, strict=True)
        ]
        if rng.random() < 0.5:
            sides.reverse()
        a, b = sides

        def pick(options: Sequence[Any]) -> Any:
            return rng.choice(options) if options else None

        meets = conjunction_forms(
            a, b, pick(a.predicates), pick(b.predicates), pick(a.gaps), pick(b.gaps)
        )
        tail = branches[0][merge_at[0] :]
        if not tail:
            return frame_question(rng.choice([m for m in meets if m.top]), rng)
        *inner, last = tail
        phrase = _pick(meets, inner[0] if inner else last, rng)
        phrase = _walk_hops(phrase, inner, last, rng).phrase
    forms = hop_forms(phrase, last["relation"], bool(last["inverse"]))
    top = rng.choice([f for f in forms if f.top])
    return frame_question(top, rng)


def path_question(row: dict[str, Any], rng: random.Random | None = None) -> str:
    """A question for a walk (chain, 2I, IP or PI) naming topics and relations only.

    Without ``rng`` the one canonical form ("What is the genre of X?"); with it, forms drawn
    from the paraphrase families. (Constraint walks: :mod:`kgsynth.llm.constraint_questions`;
    :func:`kgsynth.llm.template.question_from_walk` picks between the two.)"""
    if rng is None:
        return _canonical_question(row)
    return paraphrase_question(row, rng)


def walk_rng(seed: int | None, walk_id: str) -> random.Random:
    """The rng a walk's question forms are drawn from: same seed and walk, same question."""
    return random.Random(f"{seed}|{walk_id}")
