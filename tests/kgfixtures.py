"""Small KGs built in tests: a MetaQA-like movie KG and a Freebase-like KG with CVT nodes."""

from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.profiles import get_profile

E = "http://kgsynth.org/entity/"
R = "http://kgsynth.org/relation/"
LABEL = "<http://www.w3.org/2000/01/rdf-schema#label>"

MOVIE_FACTS = [
    ("Kismet", "directed_by", "William Dieterle"),
    ("Kismet", "starred_actors", "Marlene Dietrich"),
    ("Kismet", "starred_actors", "Ronald Colman"),
    ("Kismet", "release_year", "1944"),
    ("Juarez", "directed_by", "William Dieterle"),
    ("Juarez", "starred_actors", "Bette Davis"),
    ("Juarez", "release_year", "1939"),
    ("Jezebel", "starred_actors", "Bette Davis"),
    ("Jezebel", "directed_by", "William Wyler"),
    ("Jezebel", "release_year", "1938"),
    ("Jezebel", "has_genre", "Drama"),
    ("Juarez", "has_genre", "Drama"),
]


def movie_ntriples(facts=MOVIE_FACTS) -> str:
    from urllib.parse import quote

    from kgsynth.kg.sparql import literal

    lines, named = [], set()
    for s, r, o in facts:
        lines.append(f"<{E}{quote(s, safe='')}> <{R}{r}> <{E}{quote(o, safe='')}> .")
        for n in (s, o):
            if n not in named:
                named.add(n)
                lines.append(f"<{E}{quote(n, safe='')}> {LABEL} {literal(n)} .")
    return "\n".join(lines) + "\n"


def movie_kg() -> EmbeddedKG:
    return EmbeddedKG.from_ntriples(movie_ntriples(), get_profile("generic"))


NS = "http://rdf.freebase.com/ns/"
FREEBASE_NT = f"""
<{NS}m.irons> <{NS}type.object.name> "Jeremy Irons"@en .
<{NS}m.irons> <{NS}type.object.type> <{NS}people.person> .
<{NS}m.irons> <{NS}common.topic.alias> "Jeremy John Irons"@en .
<{NS}m.irons> <{NS}people.person.nationality> <{NS}m.uk> .
<{NS}m.irons> <{NS}people.person.date_of_birth> "1948-09-19"^^<http://www.w3.org/2001/XMLSchema#date> .
<{NS}m.uk> <{NS}type.object.name> "United Kingdom"@en .
<{NS}m.film> <{NS}type.object.name> "Dead Ringers"@en .
<{NS}m.mantle> <{NS}type.object.name> "Elliot Mantle"@en .
<{NS}m.irons> <{NS}film.actor.film> <{NS}m.cvt1> .
<{NS}m.cvt1> <{NS}film.performance.film> <{NS}m.film> .
<{NS}m.cvt1> <{NS}film.performance.actor> <{NS}m.irons> .
<{NS}m.cvt1> <{NS}film.performance.character> <{NS}m.mantle> .
<{NS}m.film> <{NS}film.film.starring> <{NS}m.cvt1> .
"""


def freebase_kg() -> EmbeddedKG:
    return EmbeddedKG.from_ntriples(FREEBASE_NT, get_profile("freebase"))


def generated_movie_facts(seed: int = 7, movies: int = 40) -> list[tuple[str, str, str]]:
    """A seeded MetaQA-like KG, big enough for every walk structure."""
    import random

    rng = random.Random(seed)
    directors = [f"Director {i}" for i in range(12)]
    actors = [f"Actor {i}" for i in range(30)]
    genres = ["Drama", "Comedy", "Western", "Horror", "Musical"]
    languages = ["English", "French", "Hindi"]
    facts = []
    for m in range(movies):
        title = f"Movie {m}"
        facts.append((title, "directed_by", rng.choice(directors)))
        for actor in rng.sample(actors, rng.randint(2, 4)):
            facts.append((title, "starred_actors", actor))
        facts.append((title, "release_year", str(1990 + rng.randrange(10))))
        for genre in rng.sample(genres, rng.randint(1, 2)):
            facts.append((title, "has_genre", genre))
        facts.append((title, "in_language", rng.choice(languages)))
        if rng.random() < 0.3:
            facts.append((title, "written_by", rng.choice(directors)))
    return facts


def build_pipeline_inputs(root, *, walks: int, structures: str) -> dict:
    """The movie facts as a triple file, imported into a store, walked and turned into template
    questions through the real CLI: ``{"kb", "store", "walks", "questions"}`` paths in ``root``."""
    from pathlib import Path

    from typer.testing import CliRunner

    from kgsynth.cli import app

    root = Path(root)
    kb = root / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in MOVIE_FACTS) + "\n")
    paths = {
        "kb": kb,
        "store": root / "store",
        "walks": root / "walks.parquet",
        "questions": root / "questions.parquet",
    }
    runner = CliRunner()
    for args in (
        ["kg", "import", str(kb), "--out", str(paths["store"])],
        ["walk", "--kg", str(paths["store"]), "--out", str(paths["walks"]), "--n", str(walks),
         "--structures", structures],
        ["synthesize", "questions", "--walks", str(paths["walks"]), "--out",
         str(paths["questions"])],
    ):  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    return paths


def tiny_agent_model(root, vocab_size: int, kv_heads: int | None = None):
    """A tiny model (``build_tiny_model``; ``kv_heads`` key-value heads, default one per
    query head) whose tokenizer was trained on a few agent turns of the movie fixture: the
    policy of the GRPO unit tests. Returns its folder."""
    from kgsynth.agent.loop import system_prompt
    from kgsynth.train.tiny import build_tiny_model

    texts = [
        system_prompt("graphwalker", 2),
        '<think>x</think><kg-query>get_relations("Kismet")</kg-query>',
        "<information>(Kismet, directed_by, William Dieterle)</information>",
        '<answer>["William Dieterle"]</answer> who directed Kismet Juarez Jezebel Bette Davis',
    ] * 4
    return build_tiny_model(texts, root, vocab_size=vocab_size, num_kv_heads=kv_heads, seed=0)


def run_make(target: str, **variables: str):
    """``make -o .venv/.installed TARGET SMOKE=1 VAR=value …`` in the repository, as a user runs
    it (torch on one thread); the finished process, its output captured."""
    import os
    import subprocess
    from pathlib import Path

    args = ["make", "-o", ".venv/.installed", target, "SMOKE=1"]
    args += [f"{k}={v}" for k, v in variables.items()]
    return subprocess.run(
        args,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )


def generated_movie_questions(kg, root, n: int = 40, seed: int = 5) -> list[dict]:
    """Template questions of ``n`` walks over ``kg`` (walks written under ``root``)."""
    import pyarrow.parquet as pq

    from kgsynth.llm.template import TemplateLLM
    from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
    from kgsynth.walk import WalkConfig, run_walks

    run_walks(kg, WalkConfig(n=n, seed=seed), root / "walks.parquet")
    walks = pq.read_table(root / "walks.parquet").to_pylist()
    return synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())[0]
