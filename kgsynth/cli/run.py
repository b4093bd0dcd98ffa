"""``kgsynth run RECIPE --kg SOURCE --out RUN``: a whole recipe on any KG, one step after another.

The recipe (a packaged one by name, ``kgsynth recipes`` lists them, or a YAML file) lists its
steps and their settings (:mod:`kgsynth.cli.recipe`); this command derives every path from
``RUN``, runs each step as its own ``kgsynth`` process (a training step may launch several),
prints one line per step, and ends with the comparison
of the evaluations. A step whose output is complete and whose command line is the one it was
made with is skipped, so a killed run resumes where it stopped; once a step runs, every later
step runs too (its inputs may have changed). ``--from`` runs a step and those after it again,
``--until`` stops after a step. Each step's output is kept in
``RUN/logs/NN-STEP.log``; a failed step prints the end of its log and its error line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import fail, stderr, stdout
from kgsynth.cli.panels import INPUTS, LAUNCH, MODEL, OUTPUT
from kgsynth.core.errors import ConfigError, KGSynthError

STATE_FILE = "run_steps.json"
"""In the run folder: each step's command-line fingerprint when its output was made."""


def default_nproc() -> int:
    """Both cores of a 2-core machine, at most two processes (the tiny models gain nothing from
    more: benchmarks/README.md, "make all in 20 minutes")."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


RunOutOption = Annotated[
    Path,
    typer.Option(
        "--out", help="The run folder; every path derives from it.", rich_help_panel=OUTPUT
    ),
]
KGSourceOption = Annotated[
    str | None,
    typer.Option(
        help="A triple file (imported into RUN/kg), a store directory or an http(s)://…/sparql "
        "endpoint. Default: the shipped MetaQA movie KB.",
        rich_help_panel=INPUTS,
    ),
]
EvalQuestionsOption = Annotated[
    Path | None,
    typer.Option(
        help="Questions to evaluate on (any format eval reads); also the contamination "
        "guard's benchmark. Default: the packaged MetaQA dev sample on the shipped KB (no "
        "--kg); with --kg and without it the evaluations are left out.",
        rich_help_panel=INPUTS,
    ),
]
NprocOption = Annotated[
    int | None,
    typer.Option(
        help="Processes for training (data-parallel) and for the policy's generation in "
        "eval and rollouts. \\[default: 2 on a machine with 2 or more cores, else 1]",
        rich_help_panel=LAUNCH,
    ),
]
StartModelOption = Annotated[
    str | None,
    typer.Option(
        help="Stage 1's starting model: tiny or a checkpoint folder (the policy).",
        rich_help_panel=MODEL,
    ),
]


def run_cmd(
    recipe: Annotated[
        str,
        typer.Argument(
            help="A packaged recipe's name (kgsynth recipes lists them: metaqa_default) or a "
            "YAML file with a steps: list.",
            show_default=False,
        ),
    ],
    out: RunOutOption,
    kg: KGSourceOption = None,
    eval_questions: EvalQuestionsOption = None,
    smoke: Annotated[
        bool,
        typer.Option(
            help="The recipe's smoke: sizes (CI-sized, minutes); the same as --size smoke.",
            rich_help_panel=INPUTS,
        ),
    ] = False,
    size: Annotated[
        str | None,
        typer.Option(
            help="One of the recipe's sizes: (`kgsynth recipes RECIPE` shows them); "
            "metaqa_default's learn is `make learn`, the longer chain.",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    from_step: Annotated[
        str | None,
        typer.Option(
            "--from", help="Run this step and every later one again.", rich_help_panel=LAUNCH
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Stop after this step.", rich_help_panel=LAUNCH)
    ] = None,
    nproc: NprocOption = None,
    llm: Annotated[
        str | None,
        typer.Option(help="Question synthesis backend: template or openai.", rich_help_panel=MODEL),
    ] = None,
    llm_model: Annotated[
        str | None,
        typer.Option(help="Question synthesis model (openai: its name).", rich_help_panel=MODEL),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            help="Question synthesis: an OpenAI-compatible server.", rich_help_panel=MODEL
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(help="Question synthesis: the server's key.", rich_help_panel=MODEL),
    ] = None,
    model: StartModelOption = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print each step's command line; run nothing.", rich_help_panel=OUTPUT
        ),
    ] = False,
) -> None:
    """Run a recipe's steps in order on any KG: walk, questions, trajectories, filter,
    training, evaluation and report, every path under --out."""
    from kgsynth.cli.recipe import RunOptions, plan
    from kgsynth.kg.open import DEFAULT_KG
    from kgsynth.resources import dev_sample, find_recipe

    try:
        recipe_path = find_recipe(recipe, note=_note)
        if eval_questions is None and kg is None:
            eval_questions = dev_sample()  # the shipped KB's own dev questions
        if eval_questions is not None and not eval_questions.is_file():
            raise ConfigError(f"--eval-questions: {eval_questions}: no such file")
        if smoke and size not in (None, "smoke"):
            raise ConfigError(f"--smoke and --size {size}: give one size")
        if nproc is not None and nproc < 1:
            raise ConfigError(f"--nproc must be >= 1 (got {nproc})")
        passed = {"llm": llm, "model": llm_model, "base_url": base_url, "api_key": api_key}
        opts = RunOptions(
            kg=kg or str(DEFAULT_KG),
            out=out,
            eval_questions=eval_questions.absolute() if eval_questions else None,
            size="smoke" if smoke else size,
            nproc=nproc or default_nproc(),
            llm={k: v for k, v in passed.items() if v is not None},
            model=model,
        )
        if opts.kg and "://" not in opts.kg and not Path(opts.kg).exists():
            raise ConfigError(f"--kg: {opts.kg}: no such file or folder")
        steps = plan(recipe_path, opts)
        names = [s.name for s in steps]
        for flag, name in (("--from", from_step), ("--until", until)):
            if name is not None and name not in names:
                raise ConfigError(
                    f"{flag}: no step {name!r} in {recipe_path}; steps: {', '.join(names)}"
                )
    except KGSynthError as exc:
        fail(exc)
    if dry_run:
        for step in steps:
            line = shlex.join(["kgsynth", *step.argv])
            line += f" > {shlex.quote(str(step.stdout_to))}" if step.stdout_to else ""
            stdout.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    _run_steps(steps, out.absolute(), from_step, until)


def _note(line: str) -> None:
    """A one-line note on stderr (an old recipe path that now names a packaged recipe)."""
    stderr.print(f"note: {line}", highlight=False, markup=False, soft_wrap=True)


def _run_steps(steps, run: Path, from_step: str | None, until: str | None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "logs").mkdir(exist_ok=True)
    state_path = run / STATE_FILE
    try:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    except (OSError, ValueError):
        state = {}  # a damaged record only costs re-running steps
    first = [s.name for s in steps].index(from_step) if from_step else 0
    ran = False
    started = time.perf_counter()
    for number, step in enumerate(steps, 1):
        head = f"[{number:>2}/{len(steps)}] {step.name:<16}"
        if number - 1 < first:
            stdout.print(
                f"{head} kept (before --from {from_step})", highlight=False, soft_wrap=True
            )
            continue
        # after a step that ran, every later one runs too: its inputs may have changed
        forced = from_step is not None or ran
        if not forced and state.get(step.name) == step.fingerprint and step.complete():
            stdout.print(f"{head} done already, skipped", highlight=False, soft_wrap=True)
        else:
            ran = True
            _run_one(step, run, number, head)
            state[step.name] = step.fingerprint
            tmp = state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
            os.replace(tmp, state_path)
        if step.name == until:
            break
    compare = run / "summary" / "compare.md"
    if compare.is_file():
        stdout.print(
            compare.read_text(encoding="utf-8"), highlight=False, markup=False, soft_wrap=True
        )
    stdout.print(f"kgsynth run: {time.perf_counter() - started:,.0f}s; outputs in {run}")


def _run_one(step, run: Path, number: int, head: str) -> None:
    log = run / "logs" / f"{number:02d}-{step.name}.log"
    command = [sys.executable, "-m", "kgsynth.cli", *step.argv]
    began = time.perf_counter()
    with (
        stderr.status(f"{head} {step.command}…"),
        open(log, "w", encoding="utf-8") as fh,
        contextlib.ExitStack() as stack,
    ):
        fh.write("$ " + shlex.join(["kgsynth", *step.argv]) + "\n")
        fh.flush()
        target = fh
        if step.stdout_to:  # kg stats --json: its stdout is the output
            target = stack.enter_context(open(step.stdout_to, "w", encoding="utf-8"))
        code = subprocess.call(command, stdout=target, stderr=fh)
    seconds = time.perf_counter() - began
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-12:]
        for line in tail:
            stderr.print(f"  {line}", highlight=False, markup=False)
        if step.stdout_to:
            step.stdout_to.unlink(missing_ok=True)
        stderr.print(
            f"[red]error:[/red] step {step.name} ({step.command}) failed with exit code {code} "
            f"after {seconds:.0f}s; its log is {log}; fix it and run the same command again "
            "(finished steps are skipped)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(code if 0 < code < 128 else 1)
    stdout.print(
        f"{head} {step.command}: {seconds:,.1f}s → {step.out}", highlight=False, soft_wrap=True
    )
