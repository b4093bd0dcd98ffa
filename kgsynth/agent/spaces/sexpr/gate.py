"""Relation Retrieval and Confidence Gating (RRCG, KBQA-R1 §IV-A3): the relation an agent
writes in an S-expression action is checked against the relations actually available where it
is applied, by the dense similarity of their words, before anything runs. ``s_max`` is the best
candidate's similarity, ``r*`` that candidate:

- the written relation is one of the candidates (same name and direction) -> it is used;
- ``s_max >= high`` (tau_high, 0.95 in §V-A4) -> auto-validated: the action runs with ``r*``;
- ``low <= s_max < high`` (tau_low, 0.3) -> tentatively accepted: the action runs with ``r*``
  and the observation says it was substituted, with the top :data:`MAX_LISTED` candidates and
  their similarity, so the agent can check it and correct itself;
- ``s_max < low`` -> rejected: nothing runs, the call fails as ``relation_not_found`` and lists
  every candidate with its similarity.

Similarity is the cosine of the written relation's words and each candidate's words
(:func:`~kgsynth.agent.toolkit.relation_words`: ``film.film.directed_by`` -> ``film film directed
by``) under the shipped all-MiniLM-L6-v2 encoder (:func:`kgsynth.agent.relrank.shared_scorer`).
When the encoder cannot load, :class:`WordOverlapScorer` (the share of words two names have in
common) stands in, and the observation says so. :func:`gate` itself is pure: candidates,
scorer and thresholds in, a :class:`GateResult` out::

    gate("director", [Candidate("directed_by", "directed by", rel)], shared_scorer(),
         high=0.95, low=0.3)   # GateResult(band="tentative", chosen=<directed_by>, ...)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.toolkit import DenseScorer, tokenize
from kgsynth.core.errors import KGError
from kgsynth.kg import sparql
from kgsynth.kg.graph import KGGraph, Relation
from kgsynth.kg.sexpr import DATE_TYPES, NUMERIC_TYPES, XSD, relation_atom
from kgsynth.kg.terms import Term

log = logging.getLogger(__name__)

EXACT = "exact"
CORRECTED = "corrected"
TENTATIVE = "tentative"
REJECTED = "rejected"
BANDS = (EXACT, CORRECTED, TENTATIVE, REJECTED)
MAX_LISTED = 5
"""The top-k candidates a tentative match lists (k is not given in KBQA-R1's text)."""
ENCODER_FALLBACK_NOTE = (
    "note: the sentence encoder could not be loaded; relations are matched by shared words."
)


@dataclass(frozen=True)
class Candidate:
    """One relation available where an action applies: how the agent writes it (``text``:
    ``directed_by``, ``(R directed_by)``), the words it is compared by, and what it stands for
    (``key``: a :class:`~kgsynth.kg.graph.Relation`, an attribute, a class)."""

    text: str
    words: str
    key: Any
    preferred: bool = True  # wins ties (the direction the agent wrote)


@dataclass(frozen=True)
class GateResult:
    """The band a written relation fell in, the candidate to use (``r*``: every band but
    rejected), and the candidates with their similarity, best first (corrected and tentative:
    the best :data:`MAX_LISTED`; rejected: every one)."""

    band: str
    chosen: Candidate | None
    ranked: tuple[tuple[Candidate, float], ...] = ()
    note: str | None = None  # the encoder fell back

    @property
    def best(self) -> float:
        return self.ranked[0][1] if self.ranked else 0.0


class WordOverlapScorer:
    """Similarity as shared words: ``|A & B| / |A | B|`` of the two texts' word sets. The
    stand-in when the sentence encoder is unavailable; identical words score 1.0."""

    def scores(self, question: str, relation_texts: Sequence[str]) -> list[float]:
        wanted = set(tokenize(question))
        out = []
        for text in relation_texts:
            words = set(tokenize(text))
            union = wanted | words
            out.append(len(wanted & words) / len(union) if union else 0.0)
        return out


def gate(
    written_words: str,
    candidates: Sequence[Candidate],
    scorer: DenseScorer | None,
    *,
    high: float,
    low: float,
    is_exact: Callable[[Candidate], bool] = lambda c: False,
) -> GateResult:
    """Gate a written relation (its words ``written_words``) against ``candidates``: the
    first ``is_exact`` candidate, else the band of the best similarity (module doc). Ties go
    to a ``preferred`` candidate, then to the earlier one. ``scorer`` None, or one that fails
    to load, falls back to :class:`WordOverlapScorer`."""
    if not low < high:
        raise ValueError(f"gate thresholds need low < high (got low {low}, high {high})")
    exact = next((c for c in candidates if is_exact(c)), None)
    if exact is not None:
        return GateResult(EXACT, exact, ((exact, 1.0),))
    if not candidates:
        return GateResult(REJECTED, None)
    texts = [c.words for c in candidates]
    note = None
    try:
        if scorer is None:
            raise RuntimeError("no sentence encoder")
        sims = [float(s) for s in scorer.scores(written_words, texts)]
    except Exception as exc:  # any load failure (missing package, model files, device)
        log.warning("sentence encoder unavailable (%s); gating relations by shared words", exc)
        sims = WordOverlapScorer().scores(written_words, texts)
        note = ENCODER_FALLBACK_NOTE
    order = sorted(
        range(len(candidates)), key=lambda i: (-round(sims[i], 6), not candidates[i].preferred, i)
    )
    ranked = tuple((candidates[i], sims[i]) for i in order)
    best = ranked[0][1]
    if best >= high:
        return GateResult(CORRECTED, ranked[0][0], ranked[:MAX_LISTED], note)
    if best >= low:
        return GateResult(TENTATIVE, ranked[0][0], ranked[:MAX_LISTED], note)
    return GateResult(REJECTED, None, ranked, note)


def listing(ranked: Sequence[tuple[Candidate, float]], limit: int | None = None) -> str:
    """``directed_by (0.58), written_by (0.41)``: candidates as an observation lists them
    (the first ``limit``; None: all)."""
    return ", ".join(f"{c.text} ({s:.2f})" for c, s in ranked[:limit])


# --- what is available where an action applies ----------------------------------------------

SAMPLED_MEMBERS = 10
"""Members of a set whose relations, attributes and classes are read (the first, by name)."""
MAX_LOOKED_UP = 200
"""Rows a look-up of a literal's relations or a set's classes reads."""
LOOKUP_TIMEOUT_S = 10.0
"""Seconds a look-up may run (as long as an agent's query)."""
_NUMBER_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_DATE_RE = re.compile(r"^-?\d{4}-\d{2}(?:-\d{2})?(?:T[\d:.]+)?(?:Z|[+-]\d{2}:\d{2})?$")


@dataclass(frozen=True)
class Named:
    """An attribute (a relation to a number or a date: ``kind`` number or date) or a class:
    its IRI, how the agent writes it (``atom``) and its name."""

    iri: str
    atom: str
    name: str
    kind: str = ""


def relations_of(graph: KGGraph, iris: Sequence[str]) -> list[Relation]:
    """The relations of the first :data:`SAMPLED_MEMBERS` entities, both directions, each
    once, in :meth:`~kgsynth.kg.graph.KGGraph.relations` order."""
    sample = list(dict.fromkeys(iris))[:SAMPLED_MEMBERS]
    graph.prefetch_lookups(fanouts=sample)
    found: dict[Relation, None] = {}
    for iri in sample:
        found.update(dict.fromkeys(graph.relations(iri)))
    return sorted(found, key=lambda r: (r.name, r.direction, r.path))


def value_kind(term: Term) -> str:
    """``number``, ``date`` or "" for a value (a literal, or an entity's name)."""
    if term.datatype in NUMERIC_TYPES:
        return "number"
    if term.datatype in DATE_TYPES:
        return "number" if term.datatype == XSD + "gYear" else "date"
    if _NUMBER_RE.match(term.value.strip()):
        return "number"
    return "date" if _DATE_RE.match(term.value.strip()) else ""


def _values(iris: Sequence[str]) -> str:
    return " ".join(sparql.iri(i) for i in dict.fromkeys(iris))


def attributes_of(graph: KGGraph, iris: Sequence[str]) -> list[Named]:
    """The number and date attributes of the first :data:`SAMPLED_MEMBERS` entities: their
    outgoing relations whose value (a literal, or the named entity's name, as the compiler
    reads ``value(o)``) is a number or a date, by one sampled value each; sorted by name."""
    sample = list(dict.fromkeys(iris))[:SAMPLED_MEMBERS]
    if not sample:
        return []
    prof = graph.profile
    names = " UNION ".join(f"{{ ?o {sparql.iri(p)} ?l }}" for p in prof.label_predicates)
    query = (
        f"SELECT ?p (SAMPLE(?v) AS ?value) WHERE {{ VALUES ?x {{ {_values(sample)} }} ?x ?p ?o . "
        f"OPTIONAL {{ {names} }} BIND(IF(isLiteral(?o), ?o, ?l) AS ?v) FILTER(BOUND(?v)) }} "
        f"GROUP BY ?p LIMIT {MAX_LOOKED_UP}"
    )
    skip = {*prof.label_predicates, *prof.type_predicates}
    found = []
    for row in _select(graph, query):
        p, value = row.get("p"), row.get("value")
        if p is None or value is None or p.value in skip or prof.is_hidden(p.value):
            continue
        kind = value_kind(value)
        if kind:
            name = prof.relation_name(p.value)
            found.append(Named(p.value, relation_atom(p.value, prof), name, kind))
    return sorted(found, key=lambda a: (a.name, a.iri))


def classes_of(graph: KGGraph, iris: Sequence[str]) -> list[Named]:
    """The classes (objects of the profile's first type predicate, as the compiler matches a
    class) of the first :data:`SAMPLED_MEMBERS` entities, sorted by name."""
    sample = list(dict.fromkeys(iris))[:SAMPLED_MEMBERS]
    prof = graph.profile
    if not sample or not prof.type_predicates:
        return []
    query = (
        f"SELECT DISTINCT ?t WHERE {{ VALUES ?x {{ {_values(sample)} }} "
        f"?x {sparql.iri(prof.type_predicates[0])} ?t . FILTER(isIRI(?t)) }} "
        f"LIMIT {MAX_LOOKED_UP}"
    )
    found = []
    for row in _select(graph, query):
        t = row["t"].value
        found.append(Named(t, relation_atom(t, prof), prof.relation_name(t)))
    return sorted(found, key=lambda c: (c.name, c.iri))


def literal_relations(graph: KGGraph, terms: Sequence[str]) -> list[Relation]:
    """The relations whose objects are one of the literal ``terms`` (written SPARQL), as
    incoming relations of the literal (``(JOIN rel literal)``)."""
    if not terms:
        return []
    query = (
        f"SELECT DISTINCT ?p WHERE {{ VALUES ?o {{ {' '.join(terms)} }} ?s ?p ?o }} "
        f"LIMIT {MAX_LOOKED_UP}"
    )
    prof = graph.profile
    rels = {
        Relation(prof.relation_name(r["p"].value), "in", (r["p"].value,))
        for r in _select(graph, query)
        if not prof.is_hidden(r["p"].value)
    }
    return sorted(rels, key=lambda r: (r.name, r.path))


def _select(graph: KGGraph, query: str) -> list[dict[str, Term]]:
    """A look-up's rows; none when the KG cannot answer it (the action still runs)."""
    try:
        return graph.kg.select(query, timeout=LOOKUP_TIMEOUT_S, max_rows=MAX_LOOKED_UP)
    except KGError as exc:
        log.warning("sexpr look-up failed (%s)", exc)
        return []


__all__ = [
    "BANDS",
    "CORRECTED",
    "EXACT",
    "MAX_LISTED",
    "REJECTED",
    "SAMPLED_MEMBERS",
    "TENTATIVE",
    "Candidate",
    "GateResult",
    "Named",
    "WordOverlapScorer",
    "attributes_of",
    "classes_of",
    "gate",
    "listing",
    "literal_relations",
    "relations_of",
    "value_kind",
]
