"""The KG layer: one protocol (SPARQL 1.1 SELECT), an embedded pyoxigraph backend and an
HTTP endpoint backend, KG profiles, import, the name index and cached graph access.

Typical use::

    from kgsynth.kg import KGGraph, open_kg
    kg = open_kg("kb.txt.gz")  # a triple file, a store dir, an http(s) URL; None: MetaQA
    graph = KGGraph(kg)        # cached entity/relation access
    graph.resolve("Kismet")
"""

from kgsynth.kg.base import KG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.open import open_kg
from kgsynth.kg.terms import Term

__all__ = ["KG", "KGGraph", "Term", "open_kg"]
