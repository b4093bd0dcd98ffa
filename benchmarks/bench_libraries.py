"""kgsynth's own stemmer, name similarity and LRU caches against the libraries that could
replace them (issue 44, item 7), side by side in one run, on real data where results matter.

    .venv/bin/python benchmarks/bench_libraries.py            # ~1-2 min on a shared core
    .venv/bin/python benchmarks/bench_libraries.py --quick    # fewer questions and lookups

Inputs: the MetaQA KB kgsynth ships (``kgsynth/resources/metaqa/kb_partial.txt.gz``) and, when
present, MetaQA's 1-hop dev questions, PathQuestion (2H and 3H) and FB15k-237's relation names
under ``--data`` (default ``../shared/data`` beside the checkout; a missing set is skipped and
said so).

1. Stemmer (``kgsynth.agent.stemming.stem`` vs ``snowballstemmer`` English and Porter): the
   relation BM25 ranks first (``toolkit.rank_relations``) for each MetaQA 1-hop dev question
   (gold: the relation that joins its topic entity to its answers) and each PathQuestion
   question (gold: its path's first relation), among the topic entity's relations in the
   KB; and how many relation-name words each stemmer joins with another form of them.
2. Name similarity (difflib's ratio in ``strategies.entities.near_names`` vs
   ``rapidfuzz.fuzz.ratio``): for MetaQA dev questions, the topic entity's name with one or
   two seeded slips (a letter dropped, doubled, swapped or replaced) read against the
   question and the answers' names: how often the first near name is the entity, how often a
   name of another entity (not in the context) is wrongly read as something, how often the
   two scores differ, and the time.
3. LRU caches (``kg.records.LRU`` and ``kg.guard._LRU`` vs ``cachetools.LRUCache``): a
   replay of Zipf-distributed keys through ``get_or_compute`` (and the guard's locked
   ``lookup``/``store``); ratios of the times.

Each section prints its numbers and a ratio (library / kgsynth, time or accuracy).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import random
import re
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kgsynth.agent import toolkit  # noqa: E402
from kgsynth.agent.stemming import stem as kgsynth_stem  # noqa: E402
from kgsynth.agent.strategies import entities  # noqa: E402
from kgsynth.kg.records import LRU, Relation  # noqa: E402

METAQA_KB = ROOT / "kgsynth" / "resources" / "metaqa" / "kb_partial.txt.gz"


def best_of(fn: Callable[[], object], rounds: int = 3) -> float:
    """The least wall time of ``rounds`` calls (the least disturbed on a shared machine)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


# --- data ----------------------------------------------------------------------------------


def read_triples(path: Path, sep: str) -> list[tuple[str, str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        rows = [line.rstrip("\n").split(sep) for line in fh if line.strip()]
    return [(r[0], r[1], r[2]) for r in rows if len(r) == 3]


def relations_at(triples: list[tuple[str, str, str]]) -> dict[str, dict[Relation, set[str]]]:
    """Each entity's relations (both directions) and the names each one reaches."""
    at: dict[str, dict[Relation, set[str]]] = defaultdict(lambda: defaultdict(set))
    for head, rel, tail in triples:
        at[head][Relation(rel, "out", (rel,))].add(tail)
        at[tail][Relation(rel, "in", (rel,))].add(head)
    return at


def metaqa_questions(data: Path, limit: int) -> list[tuple[str, str, list[str]]]:
    """(question without brackets, topic entity, answers) of MetaQA's 1-hop dev questions."""
    path = data / "metaqa" / "1-hop" / "vanilla" / "qa_dev.txt"
    if not path.is_file():
        print(f"  (no {path}: MetaQA questions skipped)")
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines()[:limit]:
        question, answers = line.split("\t")
        topic = re.search(r"\[(.+?)\]", question)
        if topic:
            out.append((question.replace("[", "").replace("]", ""), topic[1], answers.split("|")))
    return out


def pathquestion(data: Path, limit: int) -> tuple[list[tuple[str, str, str]], list]:
    """PathQuestion's KB triples and its (question, topic, first relation) rows."""
    folder = data / "pathquestion_pq"
    triples: list[tuple[str, str, str]] = []
    rows = []
    for hops in ("2H", "3H"):
        kb, qs = folder / f"{hops}-kb.txt", folder / f"PQ-{hops}.txt"
        if not (kb.is_file() and qs.is_file()):
            print(f"  (no {folder}: PathQuestion skipped)")
            return [], []
        triples += read_triples(kb, "\t")
        for line in qs.read_text(encoding="utf-8").splitlines()[:limit]:
            question, _, path = line.split("\t")
            topic, first = path.split("#")[:2]
            rows.append((question.replace("_", " "), topic, first))
    return triples, rows


# --- 1. stemmer ----------------------------------------------------------------------------


def ranked_first(question: str, rels: list[Relation], stem: Callable[[str], str]) -> str:
    toolkit.stem = stem  # rank_relations reads the module's name at each call
    try:
        return toolkit.rank_relations(question, rels)[0].name
    finally:
        toolkit.stem = kgsynth_stem


def stemmer_section(data: Path, limit: int) -> None:
    import snowballstemmer

    english, porter = snowballstemmer.stemmer("english"), snowballstemmer.stemmer("porter")
    stemmers = {"kgsynth": kgsynth_stem, "snowball": english.stemWord, "porter": porter.stemWord}
    print("\n== 1. stemmer: relation ranked first (BM25 over stemmed words) ==")
    meta = relations_at(read_triples(METAQA_KB, "|"))
    cases = []  # (set, question, candidate relations, gold relation names)
    for question, topic, answers in metaqa_questions(data, limit):
        rels = meta.get(topic)
        if rels:
            gold = {r.name for r, names in rels.items() if names & set(answers)}
            cases.append(("MetaQA 1-hop dev", question, list(rels), gold))
    pq_triples, pq_rows = pathquestion(data, limit)
    pq = relations_at(pq_triples)
    for question, topic, first in pq_rows:
        if pq.get(topic):
            cases.append(("PathQuestion 2H+3H", question, list(pq[topic]), {first}))
    for name in sorted({c[0] for c in cases}):
        subset = [c for c in cases if c[0] == name]
        right = {
            label: sum(ranked_first(q, rels, fn) in gold for _, q, rels, gold in subset)
            for label, fn in stemmers.items()
        }
        ours = right["kgsynth"]
        line = ", ".join(f"{k} {v / len(subset):.4f}" for k, v in right.items())
        ratio = right["snowball"] / ours if ours else float("nan")
        print(f"  {name} ({len(subset)} questions): top-1 {line}; snowball/kgsynth {ratio:.3f}")
    words = relation_words(data)
    for label, fn in stemmers.items():
        groups: dict[str, set[str]] = defaultdict(set)
        for w in words:
            groups[fn(w)].add(w)
        joined = sum(len(g) for g in groups.values() if len(g) > 1)
        print(f"  {label}: {joined} of {len(words)} relation-name words share a stem with another")
    extra = ["directors", "directed", "writers", "wrote", "acted", "actors", "starring"]
    sample = sorted(words) + extra
    for label, fn in stemmers.items():
        print(f"  {label}: " + " ".join(f"{w}>{fn(w)}" for w in extra))
    kgsynth_stem.cache_clear()
    ours_t = best_of(lambda: [kgsynth_stem.__wrapped__(w) for w in sample * 20])
    snow_t = best_of(lambda: [english.stemWord(w) for w in sample * 20])
    print(f"  time per word (uncached): kgsynth {ours_t / len(sample) / 20 * 1e6:.2f} us, ")
    print(
        f"    snowball {snow_t / len(sample) / 20 * 1e6:.2f} us; snowball/kgsynth {snow_t / ours_t:.2f}"
    )


def relation_words(data: Path) -> set[str]:
    """The words of every relation name of MetaQA, PathQuestion and FB15k-237."""
    names = {r for _, r, _ in read_triples(METAQA_KB, "|")}
    for path in (
        data / "pathquestion_pq" / "2H-kb.txt",
        data / "pathquestion_pq" / "3H-kb.txt",
    ):
        if path.is_file():
            names |= {r for _, r, _ in read_triples(path, "\t")}
    fb = data / "fb15k237" / "kgbert" / "relations.txt"
    if fb.is_file():
        names |= set(fb.read_text(encoding="utf-8").split())
    return {w for n in names for w in toolkit.tokenize(n) if len(w) > 3}


# --- 2. name similarity --------------------------------------------------------------------


def slip(name: str, rng: random.Random, slips: int) -> str:
    """``name`` with ``slips`` seeded typing slips: a letter dropped, doubled, swapped with its
    neighbour or replaced by a neighbouring letter of the alphabet."""
    chars = list(name)
    for _ in range(slips):
        spots = [i for i, c in enumerate(chars) if c.isalpha()]
        if len(spots) < 2:
            break
        i = rng.choice(spots[:-1])
        kind = rng.randrange(4)
        if kind == 0:
            del chars[i]
        elif kind == 1:
            chars.insert(i, chars[i])
        elif kind == 2:
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
        else:
            chars[i] = chr((ord(chars[i].lower()) - 97 + 1) % 26 + 97)
    return "".join(chars)


def context_names(question: str) -> set[str]:
    """The word spans ``near_names`` reads a question as."""
    words = question.split()
    return {
        " ".join(words[i:j]).strip(entities._EDGE_PUNCTUATION)
        for i in range(len(words))
        for j in range(i + 1, min(len(words), i + entities._SPAN_WORDS) + 1)
    }


def difflib_near_names(name, question, shown, cutoff=entities.NEAR_NAME_CUTOFF):
    """``near_names`` as it was before rapidfuzz: difflib's own quick bounds, then its ratio."""
    target = " ".join(name.casefold().split())
    if not target:
        return []
    scored = []
    for candidate in context_names(question) | set(shown):
        folded = " ".join(candidate.casefold().split())
        if not folded or folded == target:
            continue
        matcher = difflib.SequenceMatcher(None, target, folded, autojunk=False)
        if matcher.real_quick_ratio() < cutoff or matcher.quick_ratio() < cutoff:
            continue
        ratio = matcher.ratio()
        if ratio >= cutoff:
            scored.append((ratio, candidate))
    scored.sort(key=lambda s: (-s[0], -len(s[1]), s[1]))
    return [c for _, c in scored]


def rapidfuzz_near_names(name, question, shown, cutoff=entities.NEAR_NAME_CUTOFF):
    """``near_names`` with rapidfuzz's ratio (normalized Indel similarity) for difflib's."""
    from rapidfuzz import fuzz

    target = " ".join(name.casefold().split())
    if not target:
        return []
    scored = []
    for candidate in context_names(question) | set(shown):
        folded = " ".join(candidate.casefold().split())
        if not folded or folded == target:
            continue
        ratio = fuzz.ratio(target, folded, score_cutoff=cutoff * 100) / 100
        if ratio >= cutoff:
            scored.append((ratio, candidate))
    scored.sort(key=lambda s: (-s[0], -len(s[1]), s[1]))
    return [c for _, c in scored]


def similarity_section(data: Path, limit: int) -> None:
    from rapidfuzz import fuzz

    print("\n== 2. name similarity: near_names (difflib) vs rapidfuzz.fuzz.ratio ==")
    questions = metaqa_questions(data, limit)
    if not questions:
        return
    rng = random.Random(0)
    others = [t for _, t, _ in questions]
    episodes = []  # (written name, question, shown names, meant name or None)
    for question, topic, answers in questions:
        for slips in (1, 2):
            episodes.append((slip(topic, rng, slips), question, answers[:20], topic))
        stranger = rng.choice(others)  # a name of another entity, not in this context
        if stranger != topic and stranger not in answers:
            episodes.append((stranger, question, answers[:20], None))
    variants = {
        "difflib": difflib_near_names,  # before
        "rapidfuzz filter + difflib": entities.near_names,  # as shipped
        "rapidfuzz alone": rapidfuzz_near_names,
    }
    for label, fn in variants.items():
        found = wrong = read_stranger = 0
        slipped = sum(m is not None for *_, m in episodes)
        for name, question, shown, meant in episodes:
            first = next(iter(fn(name, question, shown)), None)
            if meant is None:
                read_stranger += first is not None
            elif first == meant:
                found += 1
            elif first is not None:
                wrong += 1
        strangers = len(episodes) - slipped
        print(
            f"  {label}: slipped name read as the entity {found / slipped:.4f}, as another "
            f"{wrong / slipped:.4f} ({slipped}); another entity's name read as something "
            f"{read_stranger / strangers:.4f} ({strangers})"
        )
    for label, fn in list(variants.items())[1:]:
        same = sum(difflib_near_names(n, q, s) == fn(n, q, s) for n, q, s, _ in episodes)
        print(
            f"  {label}: lists (every name, in order) equal to before in {same} of {len(episodes)}"
        )
    pairs = {  # every (written name, context name) pair the episodes score
        (" ".join(n.casefold().split()), " ".join(c.casefold().split()))
        for n, q, shown, _ in episodes
        for c in {*shown, *q.split()}
    }
    diffs = [
        fuzz.ratio(a, b) / 100 - difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
        for a, b in pairs
    ]
    differ = [d for d in diffs if abs(d) > 1e-9]
    print(
        f"  scores of {len(pairs):,} (name, context word or name) pairs: {len(differ):,} differ "
        f"(rapidfuzz higher in {sum(d > 0 for d in differ):,}, by up to {max(differ, default=0):.3f})"
    )
    sample = episodes[:2000]
    times = {
        label: best_of(lambda fn=fn: [fn(n, q, s) for n, q, s, _ in sample])
        for label, fn in variants.items()
    }
    print(
        "  time per near_names call: "
        + ", ".join(f"{k} {v / len(sample) * 1e6:.0f} us" for k, v in times.items())
        + "; / difflib: "
        + ", ".join(f"{v / times['difflib']:.2f}" for v in times.values())
    )


# --- 3. LRU caches -------------------------------------------------------------------------


class CachetoolsLRU:
    """``kg.records.LRU``'s interface over ``cachetools.LRUCache``."""

    def __init__(self, maxsize: int) -> None:
        import cachetools

        self._data = cachetools.LRUCache(maxsize)
        self.hits = self.misses = 0

    def get_or_compute(self, key, compute):
        try:
            value = self._data[key]
        except KeyError:
            self.misses += 1
            value = self._data[key] = compute()
            return value
        self.hits += 1
        return value


class CachetoolsGuardLRU:
    """``kg.guard._LRU``'s interface (locked lookup and store) over ``cachetools.LRUCache``."""

    def __init__(self, maxsize: int) -> None:
        import cachetools

        self._data = cachetools.LRUCache(maxsize)
        self.lock = threading.Lock()

    def lookup(self, key):
        with self.lock:
            return self._data.get(key)

    def store(self, key, value) -> None:
        with self.lock:
            self._data[key] = value


def lru_section(lookups: int) -> None:
    from kgsynth.kg.guard import _LRU

    print("\n== 3. LRU caches: kgsynth's vs cachetools.LRUCache ==")
    rng = random.Random(0)
    # Zipf (s = 1) over 200,000 entities: a walk's or an agent's look-ups, a few hot, a long tail
    weights = [1 / (i + 1) for i in range(200_000)]
    keys = [f"http://example.org/e{i}" for i in rng.choices(range(200_000), weights, k=lookups)]
    for size in (1_000, 100_000):
        times = {}
        for label, make in (("kgsynth LRU", LRU), ("cachetools", CachetoolsLRU)):

            def replay(make=make, size=size):
                cache = make(size)
                for k in keys:
                    cache.get_or_compute(k, lambda k=k: k)
                return cache.hits

            times[label] = best_of(replay)
        hits = replay(LRU)
        ratio = times["cachetools"] / times["kgsynth LRU"]
        print(
            f"  get_or_compute, {lookups:,} keys, size {size:,} ({hits / lookups:.0%} hits): "
            + ", ".join(f"{k} {v / lookups * 1e9:.0f} ns" for k, v in times.items())
            + f"; cachetools/kgsynth {ratio:.2f}"
        )
        times = {}
        for label, make in (("guard _LRU", _LRU), ("cachetools", CachetoolsGuardLRU)):

            def replay_guard(make=make, size=size):
                cache = make(size)
                for k in keys:
                    if cache.lookup(k) is None:
                        cache.store(k, k)

            times[label] = best_of(replay_guard)
        ratio = times["cachetools"] / times["guard _LRU"]
        print(
            f"  guard lookup/store, size {size:,}: "
            + ", ".join(f"{k} {v / lookups * 1e9:.0f} ns" for k, v in times.items())
            + f"; cachetools/kgsynth {ratio:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--quick", action="store_true", help="fewer questions and lookups")
    args = parser.parse_args()
    limit = 1_000 if args.quick else 10_000
    start = time.perf_counter()
    stemmer_section(args.data, limit)
    similarity_section(args.data, 300 if args.quick else 3_000)
    lru_section(100_000 if args.quick else 1_000_000)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
