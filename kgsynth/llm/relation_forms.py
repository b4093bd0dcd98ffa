"""How a KG relation reads in English, for the template backend's questions.

Only the relation's own name is read, its property part (``film.film.directed_by`` -> "directed
by", ``__film__film__country`` -> "country", ``has_genre`` -> "genre"): :func:`relation_form` says what kind of English its words make, and
:func:`hop_forms`, :func:`hop_predicates` and :func:`hop_gaps` give every way this backend can
say what is one hop from a description (:class:`Phrase`). :mod:`kgsynth.llm.rule_questions`
puts these together into whole questions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kgsynth.kg.relnames import property_words


def relation_words(relation: str) -> str:
    """``film.film.directed_by`` / ``/people/person/nationality`` / ``has_genre`` / ``P57`` ->
    plain words: the property's (:func:`~kgsynth.kg.relnames.property_words`), without a
    leading has/is/in."""
    words = property_words(relation)
    return re.sub(r"^(has|is|in) ", "", words) or relation


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
