"""A seeded generator of large synthetic KGs for the scale benchmarks (issue 20).

Arguments -> a triple file (``s|r|o`` lines or N-Triples, optionally gzipped)::

    .venv/bin/python benchmarks/gen_kg.py --facts 1000000 --out /tmp/kg1m.txt.gz
    .venv/bin/python benchmarks/gen_kg.py --facts 100000 --profile freebase --format nt \\
        --out /tmp/fb.nt

What the KG looks like (all drawn from ``numpy.random.default_rng(--seed)``, so the same
arguments give the same bytes):

- ``--entities`` entities (default: one per 10 facts) in ``--types`` types; each relation goes
  from one type to another, so paths and intersections meet like in a real schema;
- power-law degrees: objects are drawn by a Zipf law (exponent ``--alpha``, 1.0) over each
  type's entities, subjects by a flatter one (``--subject-alpha``, 0.6: out-degrees are less
  skewed than in-degrees in real KGs, and fewer facts repeat), whose ranks are shuffled so that names say nothing about degree;
  relation frequencies are Zipfian too (``--relations``, default 40);
- literals: a tenth of the relations (at least 2) are numeric (``*_count``: integers, and
  ``*_year``: years, shared by many subjects) or dates (``*_date``, ``YYYY-MM-DD``); in
  N-Triples they are typed literals (``xsd:integer``, ``xsd:gYear``, ``xsd:date``), in ``s|r|o``
  files plain values (which ``kgsynth kg import`` makes named entities, as MetaQA does);
- names: each entity has a unique two-word name made of syllables (``Karo Menuti``);
- ``--profile freebase``: ids ``m.0…``, relations ``domain.type.property``, names by
  ``type.object.name`` with ``@en``; ``--cvt-fraction`` of the facts on a quarter of the
  relations go through an unnamed intermediate node (``s r.a c . c r.b o``, Freebase's CVTs).
  The ``s|r|o`` form writes Freebase paths (``/m/0abc|/film/film/x|/m/0xyz``) and a names file
  ``OUT.names.tsv`` (``id<TAB>name``, CVT nodes left out) for ``kg import --names``.

``--facts`` counts fact lines (a CVT fact is two triples); names are extra triples. Rows are
not made unique: a store keeps a repeated fact once, so a store may hold a few fewer facts.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import quote

import numpy as np

SYLLABLES = [
    a + b
    for a in ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh")
    for b in ("a", "e", "i", "o")
]  # 64 syllables: 4 of them name 16.7 M entities
DOMAINS = ("film", "people", "location", "music", "book", "sports", "business", "education")
PROPS = (
    "directed_by",
    "written_by",
    "starring",
    "genre",
    "language",
    "country",
    "member_of",
    "located_in",
    "part_of",
    "founded_by",
    "employer",
    "spouse",
    "award",
    "producer",
    "publisher",
    "author",
    "team",
    "league",
    "school",
    "subject",
)
KGSYNTH_ENTITY = "http://kgsynth.org/entity/"
KGSYNTH_RELATION = "http://kgsynth.org/relation/"
FREEBASE_NS = "http://rdf.freebase.com/ns/"
RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"
XSD = "http://www.w3.org/2001/XMLSchema#"
CHUNK = 500_000


def entity_names(n: int) -> list[str]:
    """``n`` unique names: entity i spells i in base 64 with 4 syllables, as two words."""
    names = []
    for i in range(n):
        d = [(i >> s) & 63 for s in (18, 12, 6, 0)]
        first = SYLLABLES[d[0]] + SYLLABLES[d[1]]
        second = SYLLABLES[d[2]] + SYLLABLES[d[3]] + SYLLABLES[(i * 7 + 3) & 63]
        names.append(f"{first.capitalize()} {second.capitalize()}")
    return names


def freebase_mid(i: int) -> str:
    digits = "0123456789bcdfghjklmnpqrstvwxyz_"
    out = ""
    while True:
        out = digits[i % 32] + out
        i //= 32
        if i == 0:
            break
    return "m.0" + out


class Schema:
    """Relations (name, subject type, object type, literal kind or "") and the Zipf laws."""

    def __init__(self, rng: np.random.Generator, args: argparse.Namespace) -> None:
        self.types = args.types
        n_rel = args.relations
        n_lit = max(2, n_rel // 10)
        self.relations: list[tuple[str, int, int, str]] = []
        for k in range(n_rel):
            domain = DOMAINS[k % len(DOMAINS)]
            if k >= n_rel - n_lit:
                kind = ("year", "date", "count")[k % 3]
                prop = f"{PROPS[k % len(PROPS)]}_{kind}"
            else:
                kind = ""
                prop = PROPS[k % len(PROPS)]
            name = f"{domain}.{domain}_{k}.{prop}" if args.profile == "freebase" else f"{prop}_{k}"
            s_type, o_type = int(rng.integers(self.types)), int(rng.integers(self.types))
            self.relations.append((name, s_type, o_type, kind))
        w = 1.0 / np.arange(1, n_rel + 1) ** 0.8  # Zipfian relation frequencies
        self.rel_p = rng.permutation(w / w.sum())
        n_cvt = n_rel // 4 if args.profile == "freebase" and args.cvt_fraction > 0 else 0
        plain = [k for k, r in enumerate(self.relations) if not r[3]]
        self.cvt_relations = set(plain[:n_cvt])
        per_type = -(-args.entities // self.types)
        ranks = np.arange(1, per_type + 1, dtype=np.float64)
        cdf = np.cumsum(ranks**-args.alpha)
        self.cdf = cdf / cdf[-1]
        cdf = np.cumsum(ranks**-args.subject_alpha)
        self.subject_cdf = cdf / cdf[-1]
        self.per_type = per_type
        # entity id of (type t, rank k) = perm[k * types + t]: shuffled so names hide degree
        self.perm = rng.permutation(per_type * self.types)
        self.entities = args.entities

    def draw(self, rng: np.random.Generator, types: np.ndarray, *, subject: bool) -> np.ndarray:
        k = np.searchsorted(self.subject_cdf if subject else self.cdf, rng.random(len(types)))
        ids = self.perm[k * self.types + types]
        return ids % self.entities  # the last type may be short: fold its overflow back


def literal_values(rng: np.random.Generator, kind: str, n: int) -> list[str]:
    if kind == "year":  # years are shared by many subjects, like MetaQA's release_year
        return [str(y) for y in rng.integers(1900, 2025, n)]
    if kind == "count":
        return [str(int(v)) for v in np.floor(10 ** rng.uniform(0, 7, n))]
    days = rng.integers(0, 125 * 365, n)
    dates = np.datetime64("1900-01-01") + days.astype("timedelta64[D]")
    return [str(d) for d in dates]


def generate(args: argparse.Namespace) -> Iterator[tuple[str, str, str, str]]:
    """Facts ``(s, r, o, literal kind)`` in chunks; ids are entity names (generic) or mids
    (freebase); a CVT fact comes as two rows through a node ``cvt:K``."""
    rng = np.random.default_rng(args.seed)
    schema = Schema(rng, args)
    names = entity_names(args.entities) if args.profile != "freebase" else None
    ident = names if names is not None else [freebase_mid(i) for i in range(args.entities)]
    cvt = 0
    remaining = args.facts
    while remaining > 0:
        n = min(CHUNK, remaining)
        remaining -= n
        rels = rng.choice(len(schema.relations), size=n, p=schema.rel_p)
        s_types = np.array([schema.relations[r][1] for r in range(len(schema.relations))])[rels]
        o_types = np.array([schema.relations[r][2] for r in range(len(schema.relations))])[rels]
        subjects = schema.draw(rng, s_types, subject=True)
        objects = schema.draw(rng, o_types, subject=False)
        use_cvt = rng.random(n) < args.cvt_fraction
        lits: dict[int, Iterator[str]] = {}
        for k, (_, _, _, kind) in enumerate(schema.relations):
            if kind:
                lits[k] = iter(literal_values(rng, kind, int((rels == k).sum())))
        for s, r, o, c in zip(
            subjects.tolist(), rels.tolist(), objects.tolist(), use_cvt.tolist(), strict=True
        ):
            name, _, _, kind = schema.relations[r]
            if kind:
                yield ident[s], name, next(lits[r]), kind
            elif c and r in schema.cvt_relations:
                node = f"cvt:{cvt}"
                cvt += 1
                yield ident[s], f"{name}.a", node, ""
                yield node, f"{name}.b", ident[o], ""
            else:
                yield ident[s], name, ident[o], ""


def _open(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=1, newline="")
    return open(path, "w", encoding="utf-8", newline="")


def _nt_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write(args: argparse.Namespace) -> dict[str, int]:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fb = args.profile == "freebase"
    rows = 0
    used: set[str] = set()
    literals: set[str] = set()  # literal values: named by themselves in the names file
    xsd = {"year": "gYear", "date": "date", "count": "integer"}
    with _open(out) as fh:
        buf: list[str] = []
        for s, r, o, kind in generate(args):
            rows += 1
            if args.format == "sro":
                if fb:
                    s_out = s if s.startswith("cvt:") else "/" + s.replace(".", "/")
                    o_out = o if (kind or o.startswith("cvt:")) else "/" + o.replace(".", "/")
                    r_out = "/" + r.replace(".", "/")
                    buf.append(f"{s_out}|{r_out}|{o_out}\n")
                else:
                    buf.append(f"{s}|{r}|{o}\n")
            else:
                if fb:
                    s_iri = FREEBASE_NS + s.replace(":", "_")
                    o_term = (
                        f"{_nt_literal(o)}^^<{XSD}{xsd[kind]}>"
                        if kind
                        else f"<{FREEBASE_NS}{o.replace(':', '_')}>"
                    )
                    buf.append(f"<{s_iri}> <{FREEBASE_NS}{r}> {o_term} .\n")
                else:
                    o_term = (
                        f"{_nt_literal(o)}^^<{XSD}{xsd[kind]}>"
                        if kind
                        else f"<{KGSYNTH_ENTITY}{quote(o, safe='')}>"
                    )
                    buf.append(
                        f"<{KGSYNTH_ENTITY}{quote(s, safe='')}> "
                        f"<{KGSYNTH_RELATION}{quote(r, safe='')}> {o_term} .\n"
                    )
            if not s.startswith("cvt:"):
                used.add(s)
            if kind:
                literals.add(o)
            elif not o.startswith("cvt:"):
                used.add(o)
            if len(buf) >= 100_000:
                fh.write("".join(buf))
                buf.clear()
        fh.write("".join(buf))
        names = entity_names(args.entities)
        ids = [freebase_mid(i) for i in range(len(names))] if fb else names
        named = 0
        if args.format == "nt":
            label = f"<{FREEBASE_NS}type.object.name>" if fb else f"<{RDFS_LABEL}>"
            lang = "@en" if fb else ""
            for i, ident in enumerate(ids):
                if ident not in used:
                    continue
                named += 1
                iri = FREEBASE_NS + ident if fb else KGSYNTH_ENTITY + quote(ident, safe="")
                buf.append(f"<{iri}> {label} {_nt_literal(names[i])}{lang} .\n")
                if len(buf) >= 100_000:
                    fh.write("".join(buf))
                    buf.clear()
            fh.write("".join(buf))
    if fb and args.format == "sro":
        names_path = names_file(out)
        with _open(names_path) as fh:
            for i, ident in enumerate(ids):
                if ident in used:
                    named += 1
                    fh.write(f"/{ident.replace('.', '/')}\t{names[i]}\n")
            for value in sorted(literals):
                fh.write(f"{value}\t{value}\n")
    return {"fact_rows": rows, "named_entities": named or len(used)}


def names_file(out: Path) -> Path:
    """Where the freebase ``s|r|o`` form's ``id<TAB>name`` file goes."""
    return out.with_name(out.name.removesuffix(".gz") + ".names.tsv")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--facts", type=int, required=True, help="fact lines to write")
    p.add_argument("--entities", type=int, default=None, help="default: facts / 10")
    p.add_argument("--relations", type=int, default=40)
    p.add_argument("--types", type=int, default=8)
    p.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent of in-degrees")
    p.add_argument("--subject-alpha", type=float, default=0.6, help="Zipf exponent of out-degrees")
    p.add_argument("--profile", choices=("generic", "freebase"), default="generic")
    p.add_argument("--cvt-fraction", type=float, default=0.3, help="freebase: facts via CVTs")
    p.add_argument("--format", choices=("sro", "nt"), default=None, help="default: from --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.entities is None:
        args.entities = max(10, args.facts // 10)
    if args.format is None:
        name = args.out.removesuffix(".gz")
        args.format = "nt" if name.endswith(".nt") else "sro"
    if args.profile != "freebase":
        args.cvt_fraction = 0.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    counts = write(args)
    print(
        f"{counts['fact_rows']:,} fact rows, {counts['named_entities']:,} named entities "
        f"-> {args.out} in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
