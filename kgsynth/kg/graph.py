"""Cached entity/relation access over any KG backend.

:class:`KGGraph` is what the agent tools and the walker use: resolve a name to an entity,
list an entity's relations in both directions, list the neighbours along one relation. Every
look-up is one SPARQL query built with :mod:`kgsynth.kg.sparql`; results are kept in bounded
LRU caches. :meth:`KGGraph.prefetch_lookups` fills those caches for many look-ups at once
with batched ``VALUES`` queries (the walker asks for the look-ups of hundreds of attempts per
round). A store imported with a fan-out table (:mod:`kgsynth.kg.fanouts`) answers fan-outs,
names and the walker's target picks from it instead, without a query. On profiles that
flatten unnamed nodes (Freebase CVTs) a relation may be a two-edge path ``r1.r2`` crossing an
unnamed node; callers see it as one relation.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence

import numpy as np

from kgsynth.kg import sparql
from kgsynth.kg.base import KG
from kgsynth.kg.fanouts import FanoutTable
from kgsynth.kg.names import NameIndex, build_name_index
from kgsynth.kg.prefetch import BatchPrefetch
from kgsynth.kg.records import (  # noqa: F401  (re-exported: callers import them from here)
    LRU,
    Direction,
    Entity,
    Neighbor,
    Relation,
    Resolution,
    cache_dir,
    term_value,
)
from kgsynth.kg.terms import Term

log = logging.getLogger(__name__)


class KGGraph(BatchPrefetch):
    """The KG as the agent's tools and the walker see it: named entities, their relations in
    both directions and their neighbours, looked up with caching. A :class:`~kgsynth.kg.base.KG`
    is the store those look-ups are sent to as SPARQL; a ``KGGraph`` is built over one."""

    def __init__(self, kg: KG, *, cache_size: int = 200_000, max_neighbors: int = 10_000) -> None:
        self.kg = kg
        self.profile = kg.profile
        self.cache_size = cache_size
        self.max_neighbors = max_neighbors
        self._resolve_cache = LRU(cache_size)
        self._relations_cache = LRU(cache_size)
        self._neighbors_cache = LRU(cache_size)
        self._label_cache = LRU(cache_size)
        self._targets_cache = LRU(cache_size)
        self._name_index: NameIndex | None = getattr(kg, "name_index", None)
        # per-entity relation counts stored at import (kgsynth.kg.fanouts): fan-outs without a
        # query; a table made under another profile, or one that flattens unnamed nodes
        # (whose relations are paths the table does not count), is not used
        table: FanoutTable | None = getattr(kg, "fanout_table", None)
        self._table = (
            table
            if table is not None
            and table.profile == self.profile.name
            and not self.profile.flatten_unnamed
            else None
        )
        # entity -> its relations whose targets the table holds, with their rows
        self._table_rows = LRU(cache_size)
        # by table row code: its relation and rank in relation order (BatchPrefetch)
        self._table_codes: tuple[np.ndarray, np.ndarray] | None = None
        # (predicate IRI, direction) -> its Relation, or None for a hidden one
        self._relation_of: dict[tuple[str, str], Relation | None] = {}
        labels = " ".join(sparql.iri(p) for p in self.profile.label_predicates)
        self._label_values = f"VALUES ?lp {{ {labels} }}"
        # hidden predicates known by name (every entity has a name): batched fan-out counts
        # leave them out in the query, a third fewer rows to decode and count
        hidden = [
            p
            for p in dict.fromkeys((*self.profile.label_predicates, *self.profile.hidden_relations))
            if self.profile.is_hidden(p)
        ]
        self._not_hidden = (
            f"FILTER(?r NOT IN ({', '.join(sparql.iri(p) for p in sorted(hidden))})) "
            if hidden
            else ""
        )

    @property
    def fanout_table(self) -> FanoutTable | None:
        """The store's fan-out table when this graph reads it (same profile, no flattened
        hops), else None."""
        return self._table

    # --- names ---------------------------------------------------------------------------

    def best_label(self, labels: list[Term]) -> str | None:
        """The name among ``labels`` in the profile's preferred language (then smallest)."""
        langs = self.profile.label_langs
        best: tuple[int, str] | None = None
        for term in labels:
            if term.kind != "literal":
                continue
            lang = (term.lang or "").lower()
            if lang not in langs:
                continue
            rank = (langs.index(lang), term.value)
            if best is None or rank < best:
                best = rank
        return best[1] if best else None

    def label(self, iri: str) -> str | None:
        """The entity's name, or None for an unnamed node."""

        def compute() -> str | None:
            if self._table is not None and self._table.has_labels:
                found = self._table.entities([iri])
                if iri in found:
                    return found[iri][1]
            rows = self.kg.select(
                f"SELECT ?l WHERE {{ {self._label_values} {sparql.iri(iri)} ?lp ?l }}"
            )
            return self.best_label([r["l"] for r in rows if "l" in r])

        return self._label_cache.get_or_compute(iri, compute)

    def display_name(self, term: Term) -> str:
        """What an observation shows for a term: its name, a literal's value, else its IRI's
        local name."""
        if term.kind == "literal":
            return term.value
        if term.kind == "iri":
            name = self.label(term.value)
            if name is not None:
                return name
            return self.profile.relation_name(term.value)
        return f"_:{term.value}"

    def _degree(self, iri: str) -> int:
        node = sparql.iri(iri)
        rows = self.kg.select(
            f"SELECT (COUNT(*) AS ?n) WHERE {{ {{ {node} ?p ?o }} UNION {{ ?s ?p {node} }} }}"
        )
        return int(rows[0]["n"].value) if rows and "n" in rows[0] else 0

    def _exact_candidates(self, name: str) -> list[str]:
        values = [sparql.literal(name)] + [
            sparql.literal(name, lang) for lang in self.profile.label_langs if lang
        ]
        # a UNION of fully bound patterns: the engines answer it from their index (a VALUES
        # join over predicate and literal made Oxigraph scan every label, ~80 ms per name)
        branches = " UNION ".join(
            f"{{ ?e {sparql.iri(p)} {v} }}" for p in self.profile.label_predicates for v in values
        )
        query = f"SELECT DISTINCT ?e WHERE {{ {branches} FILTER(isIRI(?e)) }} LIMIT 1000"
        return sorted({r["e"].value for r in self.kg.select(query) if "e" in r})

    def _pick(self, iris: list[str]) -> str:
        if len(iris) == 1:
            return iris[0]
        ranked = sorted(iris[:50], key=lambda i: (-self._degree(i), i))
        return ranked[0]

    def resolve(self, name: str) -> Resolution | None:
        """The entity called ``name``: exact label first, then the case-insensitive index.

        Ambiguous names resolve to the candidate with the highest degree (ties: smallest IRI),
        and ``candidates`` reports how many there were. Returns None when nothing matches;
        text that no KG name can contain (control characters) is never sent.
        """
        name = name.strip()
        if not name or len(name) > 2_000 or not sparql.is_sendable(name):
            return None

        def compute() -> Resolution | None:
            exact = self._exact_candidates(name)
            if exact:
                iri = self._pick(exact)
                return Resolution(Entity(iri, self.label(iri) or name), "exact", len(exact))
            found = self.name_index().lookup(name)
            iris = sorted({iri for iri, _ in found})
            if not iris:
                return None
            iri = self._pick(iris)
            return Resolution(
                Entity(iri, self.label(iri) or found[0][1]), "case-insensitive", len(iris)
            )

        return self._resolve_cache.get_or_compute(name, compute)

    def named_iris(self) -> Sequence[str]:
        """Every named entity's IRI, sorted: read from the fan-out table as asked for when it
        holds the names, else the name index's list."""
        if self._table is not None and self._table.has_labels:
            return self._table.named_iris()
        return self.name_index().all_iris()

    def name_index(self) -> NameIndex:
        """The case-insensitive index; built once (cached on disk) when the backend has none."""
        if self._name_index is None:
            key = hashlib.sha256(f"{self.kg.location}|{self.profile.name}".encode()).hexdigest()[
                :16
            ]
            if not self.kg.location.startswith(("http://", "https://")):
                self._name_index = NameIndex.in_memory(self._all_labels())
                return self._name_index
            path = cache_dir() / "names" / f"{key}.sqlite"
            if not path.is_file():
                log.info("building the name index of %s", self.kg.location)
                build_name_index(path, self._all_labels())
            self._name_index = NameIndex(path)
        return self._name_index

    def _all_labels(self, page: int = 10_000) -> Iterator[tuple[str, str]]:
        """Every (IRI, name), paged by key: Virtuoso refuses ORDER BY with LIMIT + OFFSET over
        its MaxSortedTopRows (10,000 by default), so each page starts after the last row."""
        after = ""
        while True:
            cond = ""
            if after:
                last_e, last_l = after
                cond = (
                    f"FILTER(STR(?e) > {sparql.literal(last_e)} || "
                    f"(STR(?e) = {sparql.literal(last_e)} && STR(?l) > {sparql.literal(last_l)}))"
                )
            rows = self.kg.select(
                f"SELECT ?e ?l WHERE {{ {self._label_values} ?e ?lp ?l . FILTER(isIRI(?e)) {cond} }} "
                f"ORDER BY STR(?e) STR(?l) LIMIT {page}"
            )
            for r in rows:
                lab = r["l"]
                if (lab.lang or "").lower() in self.profile.label_langs:
                    yield r["e"].value, lab.value
            if len(rows) < page:
                return
            after = (rows[-1]["e"].value, rows[-1]["l"].value)

    # --- relations -----------------------------------------------------------------------

    def relations(self, iri: str) -> list[Relation]:
        """Every relation of the entity, outgoing and incoming, meta relations hidden, sorted
        by (name, direction)."""
        return list(self.fanouts(iri))

    def fanouts(self, iri: str) -> dict[Relation, int]:
        """Each relation of the entity with its fan-out ``|N(e, r)|`` (distinct neighbours,
        the entity itself excluded), in :meth:`relations` order; one grouped query per
        direction (two more on profiles that flatten unnamed nodes)."""
        return self._relations_cache.get_or_compute(iri, lambda: self._fetch_fanouts(iri))

    def _named(self, var: str) -> str:
        return f"EXISTS {{ {self._label_values} {var} ?lp ?nm }}"

    def _relation(self, predicate: str, direction: str) -> Relation | None:
        """The one-edge relation along ``predicate`` (None when the profile hides it)."""
        key = (predicate, direction)
        try:
            return self._relation_of[key]
        except KeyError:
            pass
        prof = self.profile
        rel = (
            None
            if prof.is_hidden(predicate)
            else Relation(prof.relation_name(predicate), direction, (predicate,))  # type: ignore[arg-type]
        )
        self._relation_of[key] = rel
        return rel

    @staticmethod
    def _relation_order(fanouts: dict[Relation, int]) -> dict[Relation, int]:
        return dict(
            sorted(fanouts.items(), key=lambda kv: (kv[0].name, kv[0].direction, kv[0].path))
        )

    def _fetch_fanouts(self, iri: str) -> dict[Relation, int]:
        if self._table is not None:
            return self._table_fanouts([iri])[iri]
        node = sparql.iri(iri)
        prof = self.profile
        counts: dict[tuple[str, tuple[str, ...]], int] = {}
        if prof.flatten_unnamed:
            named_o = f"FILTER(isLiteral(?o) || {self._named('?o')})"
            named_s = f"FILTER({self._named('?s')})"
        else:
            named_o = named_s = ""
        queries = [
            (
                "out",
                f"SELECT ?r (COUNT(DISTINCT ?o) AS ?n) WHERE {{ {node} ?r ?o . "
                f"FILTER(?o != {node}) {named_o} }} GROUP BY ?r",
            ),
            (
                "in",
                f"SELECT ?r (COUNT(DISTINCT ?s) AS ?n) WHERE {{ ?s ?r {node} . "
                f"FILTER(?s != {node}) {named_s} }} GROUP BY ?r",
            ),
        ]
        if prof.flatten_unnamed:
            # the unnamed-node filter runs in a sub-select first: placed after the join it would
            # be evaluated over the whole two-hop neighbourhood (seconds on a hub entity)
            unnamed = f"FILTER(!isLiteral(?c)) FILTER NOT {self._named('?c')}"
            queries += [
                (
                    "out",
                    "SELECT ?r1 ?r2 (COUNT(DISTINCT ?o) AS ?n) WHERE { "
                    f"{{ SELECT DISTINCT ?r1 ?c WHERE {{ {node} ?r1 ?c . {unnamed} }} }} "
                    f"?c ?r2 ?o . FILTER(?o != {node}) {named_o} }} GROUP BY ?r1 ?r2",
                ),
                (
                    "in",
                    "SELECT ?r1 ?r2 (COUNT(DISTINCT ?s) AS ?n) WHERE { "
                    f"{{ SELECT DISTINCT ?r2 ?c WHERE {{ ?c ?r2 {node} . {unnamed} }} }} "
                    f"?s ?r1 ?c . FILTER(?s != {node}) {named_s} }} GROUP BY ?r1 ?r2",
                ),
            ]
        for direction, query in queries:
            for row in self.kg.select(query):
                if "r" in row:
                    path: tuple[str, ...] = (row["r"].value,)
                elif "r1" in row and "r2" in row:
                    path = (row["r1"].value, row["r2"].value)
                else:
                    continue
                n = int(row["n"].value) if "n" in row else 0
                if n > 0 and not any(prof.is_hidden(p) for p in path):
                    counts[(direction, path)] = n
        rels = {
            Relation(".".join(prof.relation_name(p) for p in path), direction, path): n  # type: ignore[arg-type]
            for (direction, path), n in counts.items()
        }
        return self._relation_order(rels)

    def find_relation(self, iri: str, name: str) -> list[Relation]:
        """The entity's relations called ``name`` (both directions when both exist)."""
        wanted = name.strip()
        rels = [r for r in self.relations(iri) if r.name == wanted]
        if not rels:
            folded = wanted.casefold()
            rels = [r for r in self.relations(iri) if r.name.casefold() == folded]
        return rels

    # --- neighbours ----------------------------------------------------------------------

    def pattern(self, subject: str, relation: Relation, obj: str, mid: str = "?cvt") -> str:
        """The SPARQL graph pattern for one hop ``subject --relation--> obj`` (variables or
        IRIs as written SPARQL terms); a flattened hop crosses one unnamed node, bound to the
        variable ``mid`` (give each hop of a longer pattern its own)."""
        head, tail = (obj, subject) if relation.inverse else (subject, obj)
        if len(relation.path) == 1:
            return f"{head} {sparql.iri(relation.path[0])} {tail} ."
        r1, r2 = (sparql.iri(p) for p in relation.path)
        return (
            f"{head} {r1} {mid} . {mid} {r2} {tail} . "
            f"FILTER(!isLiteral({mid})) FILTER NOT {self._named(mid)} "
            f"FILTER({head} != {tail})"
        )

    def neighbors(self, iri: str, relation: Relation) -> list[Neighbor]:
        """Entities (or literal values) reached from ``iri`` along ``relation``, sorted by
        (name, value); at most ``max_neighbors`` are fetched."""
        return self._neighbors_cache.get_or_compute(
            (iri, relation), lambda: self._fetch_neighbors(iri, relation)
        )

    def _fetch_neighbors(self, iri: str, relation: Relation) -> list[Neighbor]:
        node = sparql.iri(iri)
        hop = self.pattern(node, relation, "?o")
        query = (
            f"SELECT ?o ?l WHERE {{ {hop} OPTIONAL {{ {self._label_values} ?o ?lp ?l }} "
            f"FILTER(?o != {node}) }} LIMIT {self.max_neighbors * 4}"
        )
        labels: dict[Term, list[Term]] = {}
        for row in self.kg.select(query):
            labels.setdefault(row["o"], []).extend([row["l"]] if "l" in row else [])
        out: list[Neighbor] = []
        for term, cands in labels.items():
            name = self.best_label(cands)
            if name is None:
                if term.kind == "literal":
                    name = term.value
                elif self.profile.flatten_unnamed:
                    continue  # unnamed nodes are only crossed inside a flattened hop
                else:
                    name = self.display_name(term)
            out.append(Neighbor(term, name))
        out.sort(key=lambda n: (n.name, n.term.value))
        return out[: self.max_neighbors]

    # --- batched look-ups (what the walker uses) ------------------------------------------

    BATCH = 64
    PAIR_BATCH = 256
    LABEL_BATCH = 500

    def targets(self, iri: str, relation: Relation) -> tuple[Term, ...]:
        """The neighbours along ``relation`` without names, sorted by value (walks need only
        the terms; :meth:`neighbors` adds names for observations)."""
        return self._targets_cache.get_or_compute(
            (iri, relation), lambda: self._fetch_targets(iri, relation)
        )

    def _label_optional(self, var: str, out: str) -> str:
        """``OPTIONAL`` names of ``var`` as bound patterns (no VALUES over predicates)."""
        alts = " UNION ".join(
            f"{{ {var} {sparql.iri(p)} {out} }}" for p in self.profile.label_predicates
        )
        return f"OPTIONAL {{ {alts} }}"

    def _remember_labels(self, labels: dict[Term, list[Term]]) -> None:
        for term, cands in labels.items():
            if term.kind == "iri":
                self._label_cache.put(term.value, self.best_label(cands))

    def _fetch_targets(self, iri: str, relation: Relation) -> tuple[Term, ...]:
        if self.profile.flatten_unnamed:
            return tuple(
                sorted((n.term for n in self.neighbors(iri, relation)), key=lambda t: t.value)
            )
        node = sparql.iri(iri)
        rows = self.kg.select(
            f"SELECT DISTINCT ?o ?l WHERE {{ {self.pattern(node, relation, '?o')} "
            f"FILTER(?o != {node}) {self._label_optional('?o', '?l')} }}"
        )
        labels: dict[Term, list[Term]] = {}
        for r in rows:
            labels.setdefault(r["o"], []).extend([r["l"]] if "l" in r else [])
        self._remember_labels(labels)  # the walker names the target it picks
        return tuple(sorted(labels, key=lambda t: t.value))

    def cache_stats(self) -> dict[str, dict[str, int]]:
        caches = {
            "resolve": self._resolve_cache,
            "relations": self._relations_cache,
            "neighbors": self._neighbors_cache,
            "label": self._label_cache,
            "targets": self._targets_cache,
        }
        return {k: {"hits": c.hits, "misses": c.misses} for k, c in caches.items()}
