"""``kgsynth walk``: constrained random walks with exact answer sets (GraphWalker CRW).

KG -> ``walks.parquet`` (+ ``manifest.json`` and ``walks_stats.png``)::

    kgsynth walk --n 1000 --out runs/x/walks.parquet

    from kgsynth.walk import WalkConfig, run
    result = run(None, WalkConfig(n=100), graph=graph, chunks=Path("walks.parquet.parts"))

Each hop picks one of the current entity's allowed relations among those whose fan-out
``|N(e_t, r_t)|`` lies in ``[min_fanout, max_fanout]`` (GraphWalker Eq. 1), then a neighbour
uniformly. ``relation_sampling`` says how: ``weighted-both`` (the default, metaqa_default's)
takes either direction, weighting relation *types* by ``frequency ** -relation_balance`` so
frequent relations do not crowd out rare ones; ``uniform-out`` is GraphWalker's Alg. 1
(App. B.1): the outgoing relations only, drawn uniformly. Entities are never revisited and every
entity crossed must be named (on the freebase profile unnamed CVT nodes are crossed inside a
flattened hop). The walk's pattern is then executed as one SPARQL query — stored as its
logical form — whose full result, topic entities excluded, is the answer set.

Structures: ``chain-k`` (k = 1..5), ``2I`` (two topic entities, one hop each, meeting at the
answer with different relations), ``IP`` (2I then one more hop), ``PI`` (a 2-hop chain whose
end is intersected with a second one-hop path). Constraint structures
(:mod:`~kgsynth.walk.constraints`): ``count``, ``superlative``, ``comparative`` and ``time``
over the set one or two hops from a topic entity, with numeric and date attributes read from the KG (:mod:`~kgsynth.walk.values`);
each stores its S-expression (``sexpr``) and a SPARQL query of its own beside its answers.

Determinism and resumption: attempt ``j`` draws from ``Random(f"{seed}/{shard}/{j}")`` and the
structure quotas fill in attempt order, so the same seed and configuration give the same
file; accepted walks are written in chunks next to the output, and a re-run continues after
the last complete chunk with the same state.

Speed: the coming attempts (up to 256) are sampled side by side. Each is a generator that
says which look-ups (fan-outs, targets, names) it needs before it reads them; every round, the
look-ups of all of them are fetched in a few batched ``VALUES`` queries. An attempt's outcome
is then taken in attempt order, and only if the structure it assumed is the one it picks when
its turn comes (accepted walks change the structure weights); otherwise it is sampled again
alone. The outcome depends only on the KG's answers, never on how they were fetched, so the
walks are those of one attempt at a time with one query per look-up.

Modules: :mod:`~kgsynth.walk.config` (the options), :mod:`~kgsynth.walk.records` (a walk and its
row), :mod:`~kgsynth.walk.sampler` (one walk of a structure, and many side by side),
:mod:`~kgsynth.walk.answers` (the logical form and answer set), :mod:`~kgsynth.walk.sampling`
(the attempt loop), :mod:`~kgsynth.walk.workers` (``--workers N``) and
:mod:`~kgsynth.walk.runner` (the resumable run: :func:`run`).
"""

from kgsynth.walk.config import DEFAULT_STRUCTURES, STRUCTURE_RE, WalkConfig, WalkError
from kgsynth.walk.records import Hop, Walk, WalkState, stable_hash, walk_id_of, walk_to_row
from kgsynth.walk.runner import parts_dir, relation_coverage, run, run_walks
from kgsynth.walk.sampler import WalkSampler, finish
from kgsynth.walk.sampling import sample_walks, seed_entities

__all__ = [
    "DEFAULT_STRUCTURES",
    "STRUCTURE_RE",
    "Hop",
    "Walk",
    "WalkConfig",
    "WalkError",
    "WalkSampler",
    "WalkState",
    "finish",
    "parts_dir",
    "relation_coverage",
    "run",
    "run_walks",
    "sample_walks",
    "seed_entities",
    "stable_hash",
    "walk_id_of",
    "walk_to_row",
]
