"""Batched look-ups that fill :class:`~kgsynth.kg.graph.KGGraph`'s caches for many entities
at once: ``VALUES`` queries that return no more rows than the single look-ups would."""

from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np

from kgsynth.kg import sparql
from kgsynth.kg.fanouts import DIRECTIONS
from kgsynth.kg.records import Relation, term_value
from kgsynth.kg.terms import Term


class BatchPrefetch:
    """The batched half of :class:`~kgsynth.kg.graph.KGGraph` (its caches, ``kg``, ``profile``
    and the batch sizes are the graph's own)."""

    def prefetch(self, iris: Iterable[str], *, max_targets: int = 0) -> None:
        """Batched fan-outs of many entities, and the targets of their relations with at most
        ``max_targets`` neighbours (with their names): a few queries per ``BATCH`` entities
        instead of several per entity. Profiles that flatten unnamed nodes keep the per-entity
        look-ups."""
        if self.profile.flatten_unnamed:
            return
        todo = [i for i in dict.fromkeys(iris) if i not in self._relations_cache]
        for start in range(0, len(todo), self.BATCH):
            self._prefetch_batch(todo[start : start + self.BATCH], max_targets)

    def prefetch_lookups(
        self,
        fanouts: Iterable[str] = (),
        targets: Iterable[tuple[str, Relation]] = (),
        labels: Iterable[str] = (),
    ) -> None:
        """Fill the caches for many :meth:`fanouts`, :meth:`targets` and :meth:`label` look-ups
        at once, skipping what is cached: batched ``VALUES`` queries that return no more rows
        than the look-ups would. Look-ups a batch cannot serve (relations across unnamed nodes)
        are left to run one by one when asked."""
        if not self.profile.flatten_unnamed:
            todo = [i for i in dict.fromkeys(fanouts) if i not in self._relations_cache]
            if self._table is not None:
                self._table_fanouts(todo)
            else:
                for start in range(0, len(todo), self.BATCH):
                    self._prefetch_batch(todo[start : start + self.BATCH], 0)
            # targets the table holds are not listed: choose_target reads them
            pairs = [
                p
                for p in dict.fromkeys(targets)
                if p not in self._targets_cache and self._table_row(*p) is None
            ]
            for start in range(0, len(pairs), self.PAIR_BATCH):
                self._prefetch_targets(pairs[start : start + self.PAIR_BATCH])
        self.prefetch_labels(labels)

    def _prefetch_targets(self, pairs: list[tuple[str, Relation]]) -> None:
        """The targets of (entity, one-edge relation) pairs, without names, in one query.
        Rows name their pair by its position ``?k``: a number costs less to send and read
        back than the entity, the relation and the direction."""
        branches = []
        for direction, triple in (("out", "?e ?r ?x"), ("in", "?x ?r ?e")):
            values = " ".join(
                f"({sparql.iri(i)} {sparql.iri(r.path[0])} {k})"
                for k, (i, r) in enumerate(pairs)
                if r.direction == direction
            )
            if values:
                branches.append(f"{{ VALUES (?e ?r ?k) {{ {values} }} {triple} }}")
        found: list[list[Term]] = [[] for _ in pairs]
        for row in self.kg.select(
            f"SELECT DISTINCT ?k ?x WHERE {{ {' UNION '.join(branches)} FILTER(?x != ?e) }}"
        ):
            found[int(row["k"].value)].append(row["x"])
        for pair, terms in zip(pairs, found, strict=True):
            self._targets_cache.put(pair, tuple(sorted(terms, key=term_value)))

    def _table_fanouts(self, iris: list[str]) -> dict[str, dict[Relation, int]]:
        """Fan-outs of ``iris`` from the fan-out table into the relations cache, the rows
        holding their relations' targets into ``_table_rows``, and their names (when the table
        holds them) into the label cache. An IRI the table does not hold is in no fact.

        The rows of all of them are read and put in relation order in a few array operations
        (each relation's rank among the table's is known once): per entity, only its dicts
        are built in Python."""
        table = self._table
        iris = list(dict.fromkeys(iris))
        found = table.entities(iris)
        ids = np.fromiter((found[i][0] for i in iris if i in found), dtype=np.int64)
        entity, code, count, row = table.relation_rows(ids)
        relation_of, rank_of = self._table_relations()
        rank = rank_of[code]
        shown = rank >= 0  # hidden relations left out
        entity, code, count, row = entity[shown], code[shown], count[shown], row[shown]
        order = np.lexsort((rank[shown], entity))
        entity, code, count, row = entity[order], code[order], count[order], row[order]
        bounds = np.searchsorted(entity, np.arange(len(ids) + 1)).tolist()
        rels, counts = relation_of[code].tolist(), count.tolist()
        held = row >= 0  # its targets are held
        held_bounds = np.searchsorted(entity[held], np.arange(len(ids) + 1)).tolist()
        held_rels, held_rows = relation_of[code[held]].tolist(), row[held].tolist()
        labels = table.has_labels
        out: dict[str, dict[Relation, int]] = {}
        k = 0
        for iri in iris:
            if iri not in found:
                out[iri] = {}
                self._relations_cache.put(iri, out[iri])
                self._table_rows.put(iri, {})
                continue
            a, b = bounds[k], bounds[k + 1]
            c, d = held_bounds[k], held_bounds[k + 1]
            k += 1
            out[iri] = dict(zip(rels[a:b], counts[a:b], strict=True))
            self._relations_cache.put(iri, out[iri])
            self._table_rows.put(iri, dict(zip(held_rels[c:d], held_rows[c:d], strict=True)))
            if labels:
                self._label_cache.put(iri, found[iri][1])
        return out

    def _table_relations(self) -> tuple[np.ndarray, np.ndarray]:
        """By the table's row code ``predicate << 1 | direction``: its relation (None when
        hidden), and its rank in relation order (-1 when hidden)."""
        if self._table_codes is None:
            table = self._table
            relation_of = np.empty(2 * len(table.predicates), dtype=object)
            for code in range(len(relation_of)):
                predicate, direction = table.predicates[code >> 1], DIRECTIONS[code & 1]
                relation_of[code] = self._relation(predicate, direction)
            shown = [c for c in range(len(relation_of)) if relation_of[c] is not None]
            rank_of = np.full(len(relation_of), -1, dtype=np.int64)
            ordered = self._relation_order({relation_of[c]: c for c in shown})
            rank_of[list(ordered.values())] = np.arange(len(ordered))
            self._table_codes = (relation_of, rank_of)
        return self._table_codes

    def _table_row(self, iri: str, relation: Relation) -> int | None:
        """The table row holding the targets of ``(iri, relation)``, or None (no table, or a
        relation whose targets a query lists)."""
        if self._table is None or len(relation.path) != 1:
            return None
        if iri not in self._table_rows:
            self._table_fanouts([iri])
        return self._table_rows.get_or_compute(iri, dict).get(relation)

    def choose_target(
        self,
        iri: str,
        relation: Relation,
        rng: random.Random,
        exclude: set[str],
        *,
        iris_only: bool = False,
    ) -> Term | None:
        """What ``rng.choice`` picks from :meth:`targets` of ``(iri, relation)`` less those
        in ``exclude`` (and less literals when ``iris_only``); None, with ``rng`` untouched,
        when none is left. With a fan-out table the targets are read from it (the same list,
        in the same order) instead of being listed: a hub's relation costs what a leaf's does."""
        row = self._table_row(iri, relation)
        if row is not None:  # the table holds only rows whose targets are all IRIs
            picked = self._table.pick_target(row, exclude, rng.choice)
            return None if picked is None else Term("iri", picked)
        cands = [
            t
            for t in self.targets(iri, relation)
            if t.value not in exclude and (t.kind == "iri" or not iris_only)
        ]
        return rng.choice(cands) if cands else None

    def _prefetch_batch(self, iris: list[str], max_targets: int) -> None:
        table = self._table is not None
        counts = self._table_fanouts(iris) if table else self._query_fanouts(iris)
        if max_targets <= 0:
            return
        self._prefetch_listed_targets(counts, max_targets)

    def _query_fanouts(self, iris: list[str]) -> dict[str, dict[Relation, int]]:
        values = " ".join(f"({sparql.iri(i)} {k})" for k, i in enumerate(iris))
        fanouts_of: list[dict[Relation, int]] = [{} for _ in iris]
        # both directions in one query (~30% less than one query each); rows name their
        # entity by its position ?k
        rows = self.kg.select(
            f"SELECT ?k ?d ?r (COUNT(DISTINCT ?x) AS ?n) WHERE {{ VALUES (?e ?k) {{ {values} }} "
            '{ ?e ?r ?x BIND("out" AS ?d) } UNION { ?x ?r ?e BIND("in" AS ?d) } '
            f"FILTER(?x != ?e) {self._not_hidden}}} GROUP BY ?k ?d ?r"
        )
        for row in rows:
            rel = self._relation(row["r"].value, row["d"].value)
            if rel is not None:
                fanouts_of[int(row["k"].value)][rel] = int(row["n"].value)
        counts = dict(zip(iris, fanouts_of, strict=True))
        for iri, fanouts in counts.items():
            counts[iri] = self._relation_order(fanouts)
            self._relations_cache.put(iri, counts[iri])
        return counts

    def _prefetch_listed_targets(
        self, counts: dict[str, dict[Relation, int]], max_targets: int
    ) -> None:
        """The targets (with names) of the relations of ``counts`` with at most
        ``max_targets`` neighbours."""
        for direction, triple in (("out", "?e ?r ?x"), ("in", "?x ?r ?e")):
            pairs = [
                (iri, rel)
                for iri, fanouts in counts.items()
                for rel, n in fanouts.items()
                if n <= max_targets and rel.direction == direction
            ]
            if not pairs:
                continue
            found: dict[tuple[str, str], set[Term]] = {(i, r.path[0]): set() for i, r in pairs}
            labels: dict[Term, list[Term]] = {}
            pair_values = " ".join(f"({sparql.iri(i)} {sparql.iri(r.path[0])})" for i, r in pairs)
            rows = self.kg.select(
                f"SELECT DISTINCT ?e ?r ?x ?l WHERE {{ VALUES (?e ?r) {{ {pair_values} }} "
                f"{triple} . FILTER(?x != ?e) {self._label_optional('?x', '?l')} }}"
            )
            for row in rows:
                found[(row["e"].value, row["r"].value)].add(row["x"])
                labels.setdefault(row["x"], []).extend([row["l"]] if "l" in row else [])
            self._remember_labels(labels)
            for iri, rel in pairs:
                terms = found[(iri, rel.path[0])]
                self._targets_cache.put((iri, rel), tuple(sorted(terms, key=term_value)))

    def prefetch_labels(self, iris: Iterable[str]) -> None:
        """Names of many entities in batched queries (into the label cache)."""
        todo = [i for i in dict.fromkeys(iris) if i not in self._label_cache]
        if todo and self._table is not None and self._table.has_labels:
            for iri, (_, label) in self._table.entities(todo).items():
                self._label_cache.put(iri, label)
            todo = [i for i in todo if i not in self._label_cache]  # in no fact: the store
        # one bound pattern per label predicate: a second VALUES (over the predicates) made
        # Oxigraph scan every label
        pattern = " UNION ".join(
            f"{{ ?x {sparql.iri(p)} ?l }}" for p in self.profile.label_predicates
        )
        for start in range(0, len(todo), self.LABEL_BATCH):
            chunk = todo[start : start + self.LABEL_BATCH]
            values = " ".join(sparql.iri(i) for i in chunk)
            found: dict[str, list[Term]] = {i: [] for i in chunk}
            for row in self.kg.select(
                f"SELECT ?x ?l WHERE {{ VALUES ?x {{ {values} }} {pattern} }}"
            ):
                found[row["x"].value].append(row["l"])
            for iri, cands in found.items():
                self._label_cache.put(iri, self.best_label(cands))
