"""GraphWalker as its paper writes it (graphwalker.txt): the walker's relation draw (Alg. 1,
App. B.1) and the graphwalker tool set's observations (App. E.3, App. H), each beside
kgsynth's own behaviour, which stays the default and metaqa_default's setting."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.core.stage import Reject
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.walk.config import WalkConfig
from kgsynth.walk.sampler import WalkSampler, finish
from tests.kgfixtures import E, generated_movie_facts, movie_ntriples

# --- the walker: Alg. 1 draws an outgoing relation uniformly ------------------------------

# "Hub" has three outgoing relations, one of them frequent in the KG (weighted-both draws it
# less), and two incoming ones (weighted-both takes them too; Alg. 1 never does)
HUB_FACTS = [
    ("Hub", "common_rel", "Target A"),
    ("Hub", "rare_rel", "Target B"),
    ("Hub", "other_rel", "Target C"),
    ("Source 1", "points_to", "Hub"),
    ("Source 2", "mentions", "Hub"),
    *[(f"Thing {i}", "common_rel", f"Place {i}") for i in range(40)],
]
CHI2_DF2_P001 = 13.816  # chi-square, 2 degrees of freedom, p = 0.001


def _first_hops(relation_sampling: str, n: int = 3000) -> Counter:
    kg = EmbeddedKG.from_ntriples(movie_ntriples(HUB_FACTS), get_profile("generic"))
    cfg = WalkConfig(n=1, relation_sampling=relation_sampling, max_answers=50)
    hub = E + "Hub"
    sampler = WalkSampler(KGGraph(kg), cfg, [hub])
    taken: Counter = Counter()
    for i in range(n):
        walk = finish(sampler.sample("chain-1", random.Random(f"hop/{i}"), hub))
        rel = walk.branches[0][0].relation
        taken[(rel.name, rel.direction)] += 1
    return taken


def _chi2_uniform(counts: list[int]) -> float:
    expected = sum(counts) / len(counts)
    return sum((c - expected) ** 2 / expected for c in counts)


def test_uniform_out_never_takes_an_incoming_edge_and_draws_relations_uniformly():
    taken = _first_hops("uniform-out")
    assert {d for _, d in taken} == {"out"}
    assert set(taken) == {("common_rel", "out"), ("rare_rel", "out"), ("other_rel", "out")}
    assert _chi2_uniform(list(taken.values())) < CHI2_DF2_P001, taken


def test_weighted_both_is_kgsynth_s_draw_and_is_not_alg_1():
    """Today's default (metaqa_default sets it by name): both directions, the frequent
    relation drawn less; the uniform-out checks above fail on it."""
    taken = _first_hops("weighted-both")
    assert {d for _, d in taken} == {"out", "in"}
    out = [taken[(r, "out")] for r in ("common_rel", "rare_rel", "other_rel")]
    assert _chi2_uniform(out) > CHI2_DF2_P001
    assert taken[("common_rel", "out")] < min(
        taken[("rare_rel", "out")], taken[("other_rel", "out")]
    )
    assert WalkConfig().relation_sampling == "weighted-both"


def test_uniform_out_conjunction_branches_run_out_of_their_topics():
    kg = EmbeddedKG.from_ntriples(
        movie_ntriples(generated_movie_facts(seed=3, movies=60)), get_profile("generic")
    )
    graph = KGGraph(kg)
    cfg = WalkConfig(n=1, relation_sampling="uniform-out", max_fanout=60)
    seeds = graph.named_iris()
    sampler = WalkSampler(graph, cfg, seeds)
    hops = []
    for i in range(400):
        rng = random.Random(f"2i/{i}")
        try:
            got = finish(sampler.sample("2I", rng, rng.choice(seeds)))
        except Reject:  # a seed nothing points into, a fan-out out of bounds, ...
            continue
        hops.extend(h for branch in got.branches for h in branch)
    # the branches of a 2I read topic -> answer, each along an outgoing relation of its topic
    assert len(hops) >= 20 and {h.relation.direction for h in hops} == {"out"}


def test_relation_balance_belongs_to_weighted_both():
    with pytest.raises(ConfigError, match="relation-balance applies to --relation-sampling"):
        WalkConfig(relation_sampling="uniform-out", relation_balance=0.0)
    with pytest.raises(ConfigError, match="--relation-sampling must be"):
        WalkConfig(relation_sampling="uniform")
