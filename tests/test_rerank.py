"""GraphWalker's LLM relation rerank (Table 8) and GraphRoll's stratified question sampling."""

import pytest

from kgsynth.agent.rerank import LLMReranker, parse_order
from kgsynth.agent.tools import ToolConfig, ToolEnvironment, rank_relations
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, Completion
from kgsynth.llm.template import TemplateLLM
from kgsynth.synthesize.trajectories import select_questions
from tests.kgfixtures import movie_kg


@pytest.fixture(scope="module")
def graph():
    return KGGraph(movie_kg())


class Fixed(LLM):
    """Replies the same text to every request (or fails), and counts requests."""

    backend = "scripted"
    model = "fixed"

    def __init__(self, text: str = "", error: str | None = None) -> None:
        super().__init__()
        self.text, self.error, self.requests = text, error, []

    def generate_batch(self, requests, progress=None):
        self.requests.extend(requests)
        return [Completion("", error=self.error) if self.error else Completion(self.text)] * len(
            requests
        )


def test_parse_order():
    assert parse_order("<order>[3, 1, 2]</order>", 3) == [2, 0, 1]
    assert parse_order("sure! <order> [2, 2, 9, 0, true, 1] </order>", 3) == [1, 0]
    assert parse_order("<order>[]</order>", 3) == []
    assert parse_order("[1, 2]", 2) is None and parse_order("<order>[1,</order>", 2) is None
    assert parse_order('<order>{"a": 1}</order>', 2) is None


def relations_shown(env: ToolEnvironment, name: str) -> list[str]:
    text = env.execute(f'get_relations("{name}")').text
    return [line for line in text.splitlines() if line.startswith("(")]


def test_the_llm_order_applies_before_the_top_k(graph):
    question = "which year was Juarez released"
    juarez = graph.resolve("Juarez").entity
    bm25 = rank_relations(question, graph.relations(juarez.iri))
    n = len(bm25)
    assert n >= 3
    # the LLM puts BM25's last candidate first; the others keep their BM25 order after it
    llm = Fixed(f"<order>[{n}]</order>")
    reranker = LLMReranker(llm)
    cfg = ToolConfig(top_k_relations=2, rerank="llm")
    env = ToolEnvironment(graph, question, cfg, reranker)
    shown = relations_shown(env, "Juarez")
    assert len(shown) == 2
    assert bm25[-1].name in shown[0] and bm25[0].name in shown[1]
    # the prompt numbers the candidates as patterns; a second call on the same entity is memoized
    prompt = llm.requests[0].message_dicts()[0]["content"]
    assert "Question: which year was Juarez released" in prompt and "1. " in prompt
    relations_shown(env, "Juarez")
    assert (reranker.stats.calls, reranker.stats.memo_hits, len(llm.requests)) == (1, 1, 1)


@pytest.mark.parametrize(
    ("llm", "counter"), [(Fixed("no list here"), "unparsed"), (Fixed(error="500"), "errors")]
)
def test_a_failed_rerank_keeps_the_bm25_order(graph, llm, counter):
    question = "who directed Kismet"
    plain = relations_shown(ToolEnvironment(graph, question, ToolConfig()), "Kismet")
    reranker = LLMReranker(llm)
    env = ToolEnvironment(graph, question, ToolConfig(rerank="llm"), reranker)
    assert relations_shown(env, "Kismet") == plain
    assert getattr(reranker.stats, counter) == 1


def test_template_backend_reranks_by_words_and_says_it_is_a_rule(graph):
    question = "what is the genre of Juarez"
    env = ToolEnvironment(graph, question, ToolConfig(rerank="llm"), LLMReranker(TemplateLLM()))
    assert "has_genre" in relations_shown(env, "Juarez")[0]
    assert TemplateLLM().backend == "template"


def test_rerank_llm_needs_a_reranker(graph):
    with pytest.raises(ValueError, match="needs a reranker"):
        ToolEnvironment(graph, "q", ToolConfig(rerank="llm"))
    with pytest.raises(ValueError, match="rerank must be"):
        ToolConfig(rerank="bm25")


def test_stratified_question_sample():
    rows = [
        {"id": i, "structure": s}
        for i, s in enumerate(["chain-1"] * 50 + ["chain-2"] * 8 + ["2I"] * 2)
    ]
    first = select_questions(rows, 12)
    assert [r["id"] for r in first] == list(range(12))
    picked = select_questions(rows, 12, "structure", seed=3)
    by = {s: sum(r["structure"] == s for r in picked) for s in ("chain-1", "chain-2", "2I")}
    # round-robin: 2I runs out after 2, then chain-1 and chain-2 share the rest equally
    assert by == {"chain-1": 5, "chain-2": 5, "2I": 2}
    assert [r["id"] for r in picked] == sorted(r["id"] for r in picked)  # input order kept
    assert picked == select_questions(rows, 12, "structure", seed=3)  # seeded
    assert picked != select_questions(rows, 12, "structure", seed=4)
    assert select_questions(rows, 100, "structure") == rows
