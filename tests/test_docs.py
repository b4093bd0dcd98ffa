"""The README and docs/ stay true: the README is short and in its order, every relative link
lands on a file (and an anchor on a heading), and every ``kgsynth`` command a README code block
shows is a real command given only options it has. The slow test runs the README's quickstart
as written, at smoke size, on a small KG of its own."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from kgsynth.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SECTIONS = [
    "What kgsynth is",
    "Install",
    "Two commands",
    "Quickstart: your own KG",
    "A real LLM",
    "A real model on a GPU cluster",
    "The five papers' recipes",
    "Outputs",
    "Read more",
]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text."""
    return FENCE.findall(text)


def prose(text: str) -> str:
    """The text outside code blocks and code spans (where a link is a link)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    """Each relative link of a page whose file (or #anchor in a .md file) does not exist."""
    problems = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.name}: {target}: no heading #{anchor}")
    return problems


def kgsynth_calls(block: str) -> list[list[str]]:
    """The argument lists of the ``kgsynth`` commands in a shell code block (comments dropped,
    continuation lines joined, one list per command of a line joined by ; && ||)."""
    calls = []
    for line in block.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # not shell (a folder listing, a diagram)
        command: list[str] = []
        for word in [*words, ";"]:
            if word in {";", "&&", "||", "|"}:
                if command and command[0] == "kgsynth":
                    calls.append(command[1:])
                command = []
            else:
                command.append(word)
    return calls


def _is_group(command: Any) -> bool:
    # Typer 0.29 runs its own copy of click, so its groups are not the installed click's
    return hasattr(command, "commands")


def resolve(root: Any, args: list[str]) -> tuple[list[str], Any] | None:
    """The command words of ``kgsynth ARGS`` and the command they name; None if none."""
    command, words = root, []
    while _is_group(command):
        if len(args) <= len(words) or args[len(words)] not in command.commands:
            return None
        command = command.commands[args[len(words)]]
        words.append(command.name)
    return words, command


def check_call(root: Any, args: list[str]) -> list[str]:
    """What is wrong with ``kgsynth ARGS``: an unknown command or an option it lacks."""
    shown = "kgsynth " + " ".join(args)
    found = resolve(root, args)
    if found is None:
        return [f"{shown}: no such command"]
    words, command = found
    options = {"--help"}
    for param in command.params:
        options.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
    flags = [w.split("=")[0] for w in args[len(words) :] if w.startswith("--")]
    return [f"{shown}: {command.name} has no {flag}" for flag in flags if flag not in options]


def test_the_readme_reads_in_five_minutes() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


def test_the_readme_sections_come_in_order() -> None:
    text = FENCE.sub("", README.read_text(encoding="utf-8"))
    assert re.findall(r"^## (.+)$", text, re.M) == SECTIONS


def test_every_relative_link_resolves() -> None:
    assert len(PAGES) > 10, "docs/ lost its pages"
    problems = [p for page in PAGES for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#real-heading) [gone](c.md) [bad](b.md#no-such) [self](#top)\n"
        "`[in code](x.md)` [web](https://example.org/x.md)\n\n# Top\n"
    )
    assert broken_links(page) == [
        "a.md: c.md: no such file",
        "a.md: b.md#no-such: no heading #no-such",
    ]


def test_every_command_in_a_readme_code_block_is_real() -> None:
    root = get_command(app)
    calls = [c for b in code_blocks(README.read_text(encoding="utf-8")) for c in kgsynth_calls(b)]
    assert len(calls) >= 10, calls  # the README shows its commands; a parse that finds none fails
    problems = [p for call in calls for p in check_call(root, call)]
    assert not problems, "\n".join(problems)
    # each command named answers --help, as a user would ask it
    runner = CliRunner()
    for words in sorted({tuple(resolve(root, call)[0]) for call in calls}):
        result = runner.invoke(app, [*words, "--help"])
        assert result.exit_code == 0, (words, result.output)


def test_the_command_check_finds_a_wrong_command_or_flag() -> None:
    root = get_command(app)
    block = (
        "kgsynth walk --kg k --n 5 --out w.parquet   # a comment --not-a-flag\n"
        "kgsynth train stage9 --out x\n"
        "kgsynth eval --questions q.jsonl \\\n    --no-such-flag 3 && kgsynth frobnicate\n"
    )
    calls = kgsynth_calls(block)
    assert calls[0] == ["walk", "--kg", "k", "--n", "5", "--out", "w.parquet"]
    problems = [p for call in calls for p in check_call(root, call)]
    assert problems == [
        "kgsynth train stage9 --out x: no such command",
        "kgsynth eval --questions q.jsonl --no-such-flag 3: eval has no --no-such-flag",
        "kgsynth frobnicate: no such command",
    ]


def _small_kg(folder: Path) -> None:
    """A movie KG of 792 facts with made-up names, and questions on its first films."""
    rng = random.Random(0)
    first = ["Ada", "Bela", "Cora", "Dino", "Elsa", "Finn", "Gus", "Hana", "Ivo", "Jana",
             "Kurt", "Lena", "Milo", "Nora", "Otto", "Pia"]  # fmt: skip
    last = ["Abel", "Brandt", "Castor", "Dorn", "Engel", "Falk", "Graf", "Horn", "Iser",
            "Jung", "Klee", "Lenz", "Marx", "Nagel"]  # fmt: skip
    people = [f"{a} {b}" for a in first for b in last]
    rng.shuffle(people)
    adjectives = ["Silent", "Red", "Long", "Last", "Blue", "Iron", "Night", "Golden", "Lost",
                  "Wild", "Cold", "Bright"]  # fmt: skip
    nouns = ["River", "Harbor", "Garden", "Winter", "Station", "Mirror", "Crown", "Letter",
             "Bridge", "Tower", "Storm"]  # fmt: skip
    films = [f"The {a} {n}" for a in adjectives for n in nouns]
    facts = []
    for i, film in enumerate(films):
        facts.append((film, "directed_by", people[i % 40]))
        facts += [(film, "starred_actors", a) for a in rng.sample(people[40:], 3)]
        facts.append((film, "has_genre", rng.choice(["Drama", "Comedy", "Western", "Musical"])))
        facts.append((film, "release_year", str(1950 + rng.randrange(40))))
    (folder / "my_kg.tsv").write_text("".join("\t".join(f) + "\n" for f in facts))
    questions = [
        {"question": f"who directed {film}?", "topic_names": [film], "answer_names": [d]}
        for film, r, d in facts[:100]
        if r == "directed_by"
    ]
    (folder / "my_questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))


@pytest.mark.slow
def test_the_quickstart_runs_as_written_at_smoke_size(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart: your own KG", 1)[1].split("\n## ", 1)[0]
    script = code_blocks(section)[0]
    # the same commands, the run at CI size and in one process
    script = re.sub(r"^(kgsynth run .*)$", r"\1 --smoke --nproc 1", script, flags=re.M)
    assert "--smoke" in script, script
    _small_kg(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "mine"
    for path in ("summary/compare.md", "report.html", "corpus/accepted.parquet",
                 "eval/again/metrics.json", "kg/kg.json"):  # fmt: skip
        assert (run / path).exists(), path
    assert "| stage1 |" in done.stdout  # `cat compare.md` printed the table
