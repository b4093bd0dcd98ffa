"""The ``template`` backend: offline, rule-based and deterministic.

It does not read the prompt; it writes from the structured row each task passes along
(``Request.task`` / ``Request.context``). Questions are composed from relation names and the
walk's shape, with intermediate entities never mentioned. Every manifest of a corpus made this
way says ``backend: template`` — these are templates, not a language model.

Questions come from paraphrase families (model ``rules-v3``): each hop of a walk picks one of
several English forms for its relation and direction ("the genre of X", "X's genre", "the
things X starred in", "the one X was directed by", …), conjunctions pick one way of saying
"both", and a question frame ("What is …?", "Name …?", "Who was X directed by?", …) goes
around the result. The forms are built only from the KG's own relation names (through
:func:`relation_words`), so they work on any KG, and the draw is seeded by the generation seed
and the walk id: the same seed gives the same file. ``question_from_walk(row)`` without an rng
still gives the single canonical form of ``rules-v1``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.llm.base import LLM, Completion, ProgressFn, Request


def relation_words(relation: str) -> str:
    """``film.film.directed_by`` / ``has_genre`` / ``P57`` -> plain words."""
    last = relation.split(".")[-1] if "." in relation else relation
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", last).replace("_", " ").strip().lower()
    return re.sub(r"^(has|is|in) ", "", words) or relation


# --- the canonical form (rules-v1) ----------------------------------------------------------


def hop_phrase(noun_phrase: str, relation: str, inverse: bool) -> str:
    """A noun phrase for what is one hop from ``noun_phrase``.

    Forward ``X r ?``: "the genre of X"; forward ``X directed_by ?``: "the one X was
    directed by". Inverse ``? r X``: "the things whose genre is X" / "the things directed by X".
    """
    words = relation_words(relation)
    passive = relation.split(".")[-1].endswith("_by") or words.endswith(" by")
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


# --- paraphrase families (rules-v3) ---------------------------------------------------------

_PREPOSITIONS = frozenset(
    {"in", "on", "at", "of", "to", "from", "with", "for", "into", "as", "about", "near"}
)
# Words ending in -ed that are adjectives before a noun ("related works"), not a verb the
# subject did: "the things X related in" would be nonsense.
_ADJECTIVAL_ED = frozenset(
    {"related", "based", "used", "united", "limited", "associated", "named", "red", "bed"}
)


@dataclass(frozen=True)
class RelationForm:
    """What kind of English a relation's words make.

    ``noun``: "genre", "release year" (the W of X). ``passive``: "directed by" (participle
    "directed"). ``participle_noun``: "starred actors" (participle "starred", noun "actors":
    the actors who starred in X). ``relational``: "located in", "part of" (X is W Y).
    """

    words: str
    kind: str
    plural: bool
    participle: str = ""
    noun: str = ""


def _is_plural(word: str) -> bool:
    return word.endswith("s") and not word.endswith(("ss", "us", "is"))


def relation_form(relation: str) -> RelationForm:
    """Classify ``relation``'s words (see :class:`RelationForm`)."""
    words = relation_words(relation)
    tokens = words.split()
    plural = bool(tokens) and _is_plural(tokens[-1])
    if len(tokens) >= 2 and tokens[-1] == "by":
        return RelationForm(words, "passive", False, participle=" ".join(tokens[:-1]))
    if len(tokens) >= 2 and tokens[-1] in _PREPOSITIONS:
        return RelationForm(words, "relational", False)
    first = tokens[0] if tokens else ""
    if len(tokens) >= 2 and first.endswith("ed") and len(first) > 4 and first not in _ADJECTIVAL_ED:
        return RelationForm(
            words, "participle_noun", plural, participle=first, noun=" ".join(tokens[1:])
        )
    return RelationForm(words, "noun", plural)


@dataclass(frozen=True)
class Phrase:
    """A description of one node of a walk.

    ``role`` says where it may stand: ``name`` (a topic entity's name), ``np`` (a noun phrase:
    "the genre of X"), ``free`` (a free relative: "what X directed", usable as a noun phrase
    but not as the subject of another clause), ``wh`` (an embedded question: "which genre X
    has", only after "Tell me …") and ``direct`` (a whole question without its "?").
    ``agent``: the description is of whoever did something ("the one X was directed by").
    ``top``: may stand alone inside a frame.
    """

    text: str
    role: str = "np"
    plural: bool = False
    agent: bool = False
    top: bool = True  # may be the whole question's object ("Tell me whoever …" is not English)

    @property
    def nestable(self) -> bool:
        return self.role in ("name", "np", "free")

    @property
    def subject_ok(self) -> bool:
        """May stand as the subject of a clause ("the one X was directed by")."""
        return self.role in ("name", "np")


def _was(x: Phrase) -> str:
    return "were" if x.plural else "was"


def _has(x: Phrase) -> str:
    return "have" if x.plural else "has"


def _is(x: Phrase) -> str:
    return "are" if x.plural else "is"


_HEADS = ("the things", "the ones")


def _inverse_clauses(t: str, w: str, be_many: str, be_one: str) -> list[Phrase]:
    """Inverse forms of a passive or relational hop ("the things directed by X", "what was
    directed by X"), in the tense ``be_many``/``be_one`` give."""
    return [
        *(Phrase(f"{h} {w} {t}", plural=True) for h in _HEADS),
        Phrase(f"the things that {be_many} {w} {t}", plural=True),
        Phrase(f"what {be_one} {w} {t}", "free"),
        Phrase(f"what {be_one} {w} {t}", "direct"),
        Phrase(f"which things {be_many} {w} {t}", "direct"),
    ]


def hop_forms(x: Phrase, relation: str, inverse: bool) -> list[Phrase]:
    """Every form this backend can use for what is one hop from ``x`` (canonical first).

    Forward ``X r ?`` describes X's r; inverse ``? r X`` describes what has X as its r."""
    rel = relation_form(relation)
    w, p = rel.words, rel.participle
    out: list[Phrase] = []
    if not inverse:
        if rel.kind == "passive":
            if x.subject_ok:
                t = x.text
                out += [
                    Phrase(f"the one {t} {_was(x)} {w}", agent=True),
                    Phrase(f"whoever {t} {_was(x)} {w}", "free", agent=True, top=False),
                    Phrase(f"the one by whom {t} {_was(x)} {p}", agent=True),
                    Phrase(f"who {t} {_was(x)} {w}", "wh", agent=True),
                    Phrase(f"who {_was(x)} {t} {w}", "direct", agent=True),
                    Phrase(f"by whom {_was(x)} {t} {p}", "direct", agent=True),
                ]
            return out
        if rel.kind == "relational":
            if x.subject_ok:
                out += [
                    Phrase(f"the one {x.text} {_is(x)} {w}"),
                    Phrase(f"what {x.text} {_is(x)} {w}", "free"),
                    Phrase(f"what {_is(x)} {x.text} {w}", "direct"),
                ]
            return out
        out.append(Phrase(f"the {w} of {x.text}", plural=rel.plural))
        if x.role == "name":
            out.append(Phrase(f"{x.text}'s {w}", plural=rel.plural))
        if x.subject_ok:
            do = "do" if x.plural else "does"
            out += [
                Phrase(f"the {w} that {x.text} {_has(x)}", plural=rel.plural),
                Phrase(f"which {w} {x.text} {_has(x)}", "wh"),
                Phrase(f"what {w} {do} {x.text} have", "direct"),
                Phrase(f"which {w} {do} {x.text} have", "direct"),
            ]
        if rel.kind == "participle_noun":
            n = rel.noun
            plural = _is_plural(n.split()[-1])
            out += [
                Phrase(f"the {n} of {x.text}", plural=plural),
                Phrase(f"the {n} who {p} in {x.text}", plural=plural, agent=True),
                Phrase(f"the {n} that {p} in {x.text}", plural=plural),
                Phrase(f"whoever {p} in {x.text}", "free", agent=True, top=False),
                Phrase(f"who {p} in {x.text}", "direct", agent=True),
                Phrase(f"which {n} {p} in {x.text}", "direct"),
            ]
        return out
    # inverse: the answer is the subject of the relation
    t = x.text
    if rel.kind == "passive":
        out += _inverse_clauses(t, w, "were", "was")
        # "what X directed": only where the participle is also the past tense (-ed verbs;
        # "what X written" is not English), and after a name ("what the one … were directed
        # directed" reads as a typo).
        if p.endswith("ed") and " " not in p and x.role == "name":
            out.append(Phrase(f"what {t} {p}", "free"))
        return out
    if rel.kind == "relational":
        return out + _inverse_clauses(t, w, "are", "is")
    verb = "include" if rel.plural else "is"
    its = "among its" if rel.plural else "as its"
    their = "among their" if rel.plural else "as their"
    out += [Phrase(f"{h} whose {w} {verb} {t}", plural=True) for h in _HEADS]
    out += [
        Phrase(f"the things that have {t} {their} {w}", plural=True),
        Phrase(f"what has {t} {its} {w}", "free"),
        Phrase(f"what has {t} {its} {w}", "direct"),
        Phrase(f"which things have {t} {their} {w}", "direct"),
    ]
    if x.role == "name":  # "the things with genre the genre of X" does not parse
        out.append(Phrase(f"the things with {w} {t}", plural=True))
    if rel.kind == "participle_noun" and x.subject_ok:
        out += [
            Phrase(f"the things {t} {p} in", plural=True),
            Phrase(f"what {t} {p} in", "free"),
        ]
    return out


def hop_predicates(x: Phrase, relation: str, inverse: bool) -> list[tuple[str, str]]:
    """Verb phrases (singular, plural) saying that the answer is one hop from ``x``.

    They join two branches: "what has Drama as its genre and was directed by X"."""
    rel = relation_form(relation)
    w, t = rel.words, x.text
    if inverse:
        if rel.kind == "passive":
            return [(f"was {w} {t}", f"were {w} {t}")]
        if rel.kind == "relational":
            return [(f"is {w} {t}", f"are {w} {t}")]
        if rel.plural:
            return [(f"has {t} among its {w}", f"have {t} among their {w}")]
        return [(f"has {t} as its {w}", f"have {t} as their {w}")]
    if rel.kind == "participle_noun":
        return [(f"{rel.participle} in {t}", f"{rel.participle} in {t}")]
    if rel.kind == "noun":
        out = [(f"is the {w} of {t}", f"are the {w} of {t}")]
        if x.role == "name":
            out.append((f"is {t}'s {w}", f"are {t}'s {w}"))
        return out
    return []


def hop_gaps(x: Phrase, relation: str, inverse: bool) -> list[str]:
    """Clauses with the answer left out as their object ("Barbarosa was directed by", "Bette
    Davis starred in"); two of them join branches: "the one X was written by and Y was directed
    by". Only with ``x`` as a subject."""
    rel = relation_form(relation)
    if not x.subject_ok:
        return []
    t, w, p = x.text, rel.words, rel.participle
    if not inverse and rel.kind == "passive":
        return [f"{t} {_was(x)} {w}"]
    if not inverse and rel.kind == "relational":
        return [f"{t} {_is(x)} {w}"]
    if inverse and rel.kind == "participle_noun":
        return [f"{t} {p} in"]
    if inverse and rel.kind == "passive" and p.endswith("ed") and " " not in p and x.role == "name":
        return [f"{t} {p}"]
    return []


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


def question_from_walk(row: dict[str, Any], rng: random.Random | None = None) -> str:
    """A question for a walk (chain, 2I, IP or PI) naming topics and relations only.

    Without ``rng`` the one canonical form ("What is the genre of X?"); with it, forms drawn
    from the paraphrase families."""
    if rng is None:
        return _canonical_question(row)
    return paraphrase_question(row, rng)


def walk_rng(seed: int | None, walk_id: str) -> random.Random:
    """The rng a walk's question forms are drawn from: same seed and walk, same question."""
    return random.Random(f"{seed}|{walk_id}")


def rule_relation_order(question: str, relations: Sequence[str]) -> list[int]:
    """The template backend's answer to a relation rerank (1-based numbers): relations with
    more of their words in the question first, ties in the given (BM25) order. A rule, not a
    model: it reads words, never meaning."""
    words = set(re.findall(r"[a-z0-9]+", question.lower()))

    def overlap(name: str) -> int:
        return len(words & set(re.findall(r"[a-z0-9]+", relation_words(name).lower())))

    ranked = sorted(range(len(relations)), key=lambda i: (-overlap(relations[i]), i))
    return [i + 1 for i in ranked]


def template_thought(
    kind: str, entity: str, hop: dict[str, Any] | None, answers: Sequence[str]
) -> str:
    """The template backend's thought before an oracle action (``kind``: relations, triples
    or answer), for the trajectory synthesis of :mod:`kgsynth.synthesize.trajectories`."""
    # Short on purpose: every token of a thought is trained on, and a thought names only what
    # the next action uses (the entity it starts from, the relation it follows).
    if kind == "relations":
        return f"I list the relations of {entity}."
    if kind == "triples" and hop is not None:
        words = relation_words(hop["relation"])
        return f"The question asks for {words}: I follow {hop['relation']} from {entity}."
    return "The facts I found answer the question."


class TemplateLLM(LLM):
    backend = "template"
    model = "rules-v3"

    @property
    def key_fields(self) -> dict[str, Any]:
        # In the manifest (and the cache key): questions are drawn from paraphrase families.
        return {**super().key_fields, "questions": "paraphrase families, seeded per walk"}

    def uses_context(self) -> bool:
        return True

    def _write(self, request: Request) -> str:
        ctx = request.context_dict()
        if request.task == "question":
            rng = walk_rng(request.params.seed, str(ctx["walk_id"]))
            return f"<question>{question_from_walk(ctx, rng)}</question>"
        if request.task == "thought":
            return f"<think>{template_thought(ctx['kind'], ctx['entity'], ctx.get('hop'), ctx.get('answers', []))}</think>"
        if request.task == "rerank_relations":
            return f"<order>{json.dumps(rule_relation_order(ctx['question'], ctx['relations']))}</order>"
        raise ValueError(f"the template backend has no rule for task {request.task!r}")

    def generate_batch(
        self, requests: Sequence[Request], progress: ProgressFn | None = None
    ) -> list[Completion]:
        out = []
        for i, req in enumerate(requests):
            try:
                c = Completion(self._write(req), finish_reason="stop")
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                c = Completion("", error=f"template: {exc}")
            out.append(c)
            self.stats.add(c)
            if progress:
                progress(i, c)
        return out
