"""Entity matching, a strategy of the tool environment: how a tool reads an entity name.

``exact`` (:class:`ExactNames`) reads a name the KG has, in any case. ``near``
(:class:`NearNames`) also reads a name the KG lacks as the most similar name of the episode's
context: a word span of the question or a name an observation showed (:func:`near_names`); its
state is the names shown so far. :func:`read_answers` is the same reading applied to a final
answer (``answer_matching="near"``)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz

from kgsynth.agent.toolkit import read_as_note
from kgsynth.kg.graph import KGGraph

NEAR_NAME_CUTOFF = 0.6  # the least similarity (difflib ratio, case-folded) a near name needs
# rapidfuzz's ratio (2 * longest common subsequence / total length) is never below difflib's
# (difflib's matching blocks are one common subsequence), so it discards, in C, every name that
# cannot reach the cutoff, and difflib scores the rest: every list is as before (8,996 of 8,996
# MetaQA dev episodes) in 0.40 of the time. rapidfuzz alone (0.21 of the time) scores 17% of
# the episodes' (name, context) pairs higher, changes 1.6% of the lists, and reads a name of an
# entity outside the context as something more often (1.97% against 1.87%), so difflib stays
# the score (benchmarks/bench_libraries.py; benchmarks/README.md). The margin keeps a name
# whose ratio is the cutoff exactly from falling to float error.
_FILTER_MARGIN = 1e-6
_SPAN_WORDS = 12  # the longest word span of the question taken as a name
_EDGE_PUNCTUATION = "?!.,;:\"'()[]"


def near_names(
    name: str, question: str, shown: Sequence[str], cutoff: float = NEAR_NAME_CUTOFF
) -> list[str]:
    """Names from an episode's context that read like ``name``, most similar first: the word
    spans of the question and the names its observations showed (``shown``), scored by
    difflib's ratio on case-folded text, those at ``cutoff`` or above (rapidfuzz's ratio, an
    upper bound of it, first discards those that cannot be). Ties go to the longer name, then
    the alphabetically first, so the order is the same every time."""
    target = " ".join(name.casefold().split())
    if not target:
        return []
    words = question.split()
    spans = {
        " ".join(words[i:j]).strip(_EDGE_PUNCTUATION)
        for i in range(len(words))
        for j in range(i + 1, min(len(words), i + _SPAN_WORDS) + 1)
    }
    scored: list[tuple[float, str]] = []
    bound = max(0.0, cutoff * 100 - _FILTER_MARGIN)
    for candidate in spans | set(shown):
        folded = " ".join(candidate.casefold().split())
        if not folded or folded == target:
            continue
        if bound and not fuzz.ratio(target, folded, score_cutoff=bound):
            continue
        ratio = difflib.SequenceMatcher(None, target, folded, autojunk=False).ratio()
        if ratio >= cutoff:
            scored.append((ratio, candidate))
    scored.sort(key=lambda s: (-s[0], -len(s[1]), s[1]))
    return [candidate for _, candidate in scored]


_CUT_MIN = 3  # the shortest name read as a cut copy


def _in_order(short: str, long: str) -> bool:
    """Whether every character of ``short`` appears in ``long`` in the same order."""
    rest = iter(long)
    return all(ch in rest for ch in short)


def cut_names(name: str, names: Sequence[str]) -> list[str]:
    """Of ``names``, those ``name`` reads as a cut or slipped copy of, most similar first: a
    longer name that starts with the same character and holds all of ``name``'s characters in
    order (case-folded): "Vyaches" of "Vyacheslav Tikhonov", "As Gets" of "As Good as It
    Gets". A small policy stops copying a long name early; the difflib ratio of such a cut is
    under the near-name cutoff (0.37 for "Vyaches"), and the name the policy meant is the one
    that starts the same way and has every letter it wrote. Names of fewer than three
    characters read as nothing; ties as in :func:`near_names`."""
    target = " ".join(name.casefold().split())
    if len(target) < _CUT_MIN:
        return []
    scored: list[tuple[float, str]] = []
    for candidate in dict.fromkeys(names):
        folded = " ".join(candidate.casefold().split())
        if len(folded) > len(target) and folded[0] == target[0] and _in_order(target, folded):
            ratio = difflib.SequenceMatcher(None, target, folded, autojunk=False).ratio()
            scored.append((ratio, candidate))
    scored.sort(key=lambda s: (-s[0], -len(s[1]), s[1]))
    return [candidate for _, candidate in scored]


def read_answers(answers: Sequence[str], shown: Sequence[str]) -> list[str]:
    """``answer_matching="near"``: each answer the episode's observations never showed (in
    any case) read as the most similar name they showed (:func:`near_names` over ``shown``
    alone, ratio 0.6 or more), else kept as written; a name read twice counts once. A small
    policy copies long names with slips ("maria_of_austria_the_yonger"); the name it meant is
    the one on the page. An answer no shown name is that similar to, but which reads as a cut
    of one (:func:`cut_names`: "Para" of "Paradise Road"), is read as that name."""
    exact = {" ".join(n.casefold().split()): n for n in shown}
    out: dict[str, None] = {}
    for name in answers:
        key = " ".join(name.casefold().split())
        read = (
            exact.get(key)
            or next(iter(near_names(name, "", shown)), None)
            or next(iter(cut_names(name, shown)), name)
        )
        out.setdefault(read, None)
    return list(out)


_NEAR_TRIES = 5  # near entity matching: the most similar names tried against the KG


@dataclass
class ExactNames:
    """``entity_matching="exact"``: a name the KG has, in any case. No episode state;
    ``topics``: the question's topic entities, as the prompt names them."""

    topics: tuple[str, ...] = ()

    def resolve(self, graph: KGGraph, name: str, question: str) -> tuple[Any, tuple[str, ...]]:
        """The KG's resolution of ``name`` (None where it has none) and the notes to show."""
        return graph.resolve(name), ()

    def observe(self, names: Sequence[str]) -> None:
        """Names an observation showed (nothing to keep)."""

    def snapshot(self) -> tuple:
        return ()

    def restore(self, state: tuple) -> None:
        pass


@dataclass
class NearNames(ExactNames):
    """``entity_matching="near"``: a name the KG lacks is read as the most similar name of the
    episode's context (:func:`near_names`), else as the topic or shown name it reads as a cut
    copy of (:func:`cut_names`), and the observation's first line says which."""

    shown: tuple[str, ...] = ()  # the names the episode's observations have shown so far

    def resolve(self, graph: KGGraph, name: str, question: str) -> tuple[Any, tuple[str, ...]]:
        resolution = graph.resolve(name)
        if resolution is not None:
            return resolution, ()
        for candidates in (near_names(name, question, self.shown), self._cuts(name)):
            for candidate in candidates[:_NEAR_TRIES]:
                resolution = graph.resolve(candidate)
                if resolution is not None:
                    return resolution, (read_as_note(name, candidate),)
        return None, ()

    def _cuts(self, name: str) -> list[str]:
        return cut_names(name, (*self.topics, *self.shown))

    def observe(self, names: Sequence[str]) -> None:
        self.shown += tuple(n for n in names if n not in self.shown)

    def snapshot(self) -> tuple:
        return self.shown

    def restore(self, state: tuple) -> None:
        self.shown = state


ENTITY_MATCHINGS: dict[str, type[ExactNames]] = {"exact": ExactNames, "near": NearNames}
