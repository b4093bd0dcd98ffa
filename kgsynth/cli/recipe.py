"""A recipe's steps, planned as command lines: what ``kgsynth run RECIPE --kg SOURCE --out RUN``
runs (:mod:`kgsynth.cli.run` runs them).

A recipe (a YAML file; the packaged ones are ``kgsynth/resources/recipes/*.yaml``, listed by
``kgsynth recipes``) holds one section of settings per step and a ``steps:`` list
that puts the steps in order::

    steps:
      - {name: kg, run: kg import}                     # SOURCE -> RUN/kg
      - {name: walks, run: walk, section: walk, kg: kg}
      - {name: questions, run: synthesize questions, walks: walks, benchmark: "{eval_questions}"}
      - {name: stage1, run: train stage1, corpus: corpus/accepted.parquet, model: tiny}
      - {name: eval_stage1, run: eval, model: stage1, questions: "{eval_questions}"}

Each step names the command it runs (``run``), the recipe section holding its settings
(``section``, by default the step's name; a section the recipe lacks means the command's
defaults), where it writes (``out``, by default a place named after the step, see
:data:`DEFAULT_OUT`), and its other flags. A flag's value that is a path (:data:`PATH_FLAGS`)
is resolved in this order:

- ``{kg}``, ``{eval_questions}`` and ``{run}`` are the runner's ``--kg``, ``--eval-questions``
  and ``--out``;
- a value whose first part is an earlier step's name is that step's output (``corpus/
  accepted.parquet`` is the file inside the ``corpus`` step's folder);
- ``model`` and ``init`` values that name no step are passed as they are (``tiny``, a
  checkpoint folder); any other relative path lies in the run folder.

A step that needs ``{eval_questions}`` when the runner has none is left out (the evaluations
and the comparison, on a KG that comes without questions); a ``--benchmark`` flag that would
be ``{eval_questions}`` is dropped instead (the contamination guard then has nothing to guard).
``sizes:`` names other sizes of the same recipe, each mapping step names to the flags that
change (``kgsynth run --size NAME``; metaqa_default's ``learn`` is ``make learn``); ``smoke:``
is the size ``smoke``, the flags that make the recipe CI-sized (``kgsynth run --smoke``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgsynth.core.config import AGENT_BLOCK, load_yaml
from kgsynth.core.errors import ConfigError
from kgsynth.core.stage_io import sidecar

COMMANDS = (
    "kg import", "kg stats", "walk", "synthesize questions", "synthesize trajectories", "filter",
    "train stage1", "train stage2", "train rl", "eval", "compare", "report",
)  # fmt: skip
"""What a step may run (``compare`` is ``eval --compare``)."""

DEFAULT_OUT = {
    "kg import": "{name}",
    "kg stats": "kg_stats.json",
    "walk": "{name}/walks.parquet",
    "synthesize questions": "{name}/questions.parquet",
    "synthesize trajectories": "{name}/trajectories.parquet",
    "filter": "{name}",
    "train stage1": "{name}",
    "train stage2": "{name}",
    "train rl": "{name}",
    "eval": "eval/{name}",
    "compare": "{name}",
    "report": "report.html",
}
"""Where a step writes, relative to the run folder, unless it says ``out``."""

PATH_FLAGS = frozenset(
    {"kg", "walks", "questions", "in", "corpus", "init", "model", "select_questions",
     "select_kg", "cache", "select_cache", "benchmark", "of", "phase2_questions"}
)  # fmt: skip
"""Flags whose values are paths (see the module's resolution rules)."""

AS_GIVEN = frozenset({"model", "init"})
"""Path flags whose value may be a name rather than a path (``tiny``)."""

SECTIONLESS = frozenset({"kg import", "kg stats", "compare", "report"})
"""Commands that read no ``--config`` section."""

TRAINING = frozenset({"train stage1", "train stage2", "train rl"})

_PLACEHOLDER = re.compile(r"\{(kg|eval_questions|run)\}")
_RESERVED = {"name", "run", "section", "out"}


@dataclass(frozen=True)
class Step:
    """One step of a recipe, planned: its name, command, settings section, output (absolute)
    and the whole command line after ``kgsynth``."""

    name: str
    command: str
    out: Path
    argv: list[str]
    folder_output: bool
    stdout_to: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """What the step was run with (its command line and its section's settings): the same
        fingerprint and a complete output mean there is nothing to do."""
        body = json.dumps([self.argv, self.settings], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def complete(self) -> bool:
        """Whether the step's output was written whole (its manifest commits with it)."""
        if self.command == "kg import":
            return (self.out / "kg.json").is_file()
        if self.command in ("kg stats", "report"):
            return self.out.is_file()
        if self.folder_output:
            return (self.out / "manifest.json").is_file()
        return sidecar(self.out, "manifest.json").is_file()


@dataclass
class RunOptions:
    """What the runner brings to a recipe: the KG, the run folder, the evaluation questions,
    the sizes, the processes, and the LLM and model options that pass through."""

    kg: str
    out: Path
    eval_questions: Path | None = None
    size: str | None = None  # a size of the recipe (``smoke``, or one of its ``sizes:``)
    nproc: int = 1
    llm: dict[str, str] = field(default_factory=dict)  # synthesize questions: --llm, --model …
    model: str | None = None  # train stage1's --model


def load_recipe(path: Path) -> dict[str, Any]:
    """The recipe's mapping; a recipe without a ``steps:`` list is a one-line error."""
    data = load_yaml(path)
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ConfigError(
            f"{path}: no steps: list; a recipe for `kgsynth run` lists its steps in order "
            "(see `kgsynth recipes metaqa_default`)"
        )
    _check_agent_block(path, data.get(AGENT_BLOCK))
    return data


def _check_agent_block(path: Path, block: Any) -> None:
    """The recipe-level ``agent:`` block holds agent settings only (each step whose config
    has a setting reads it, under the step's own section)."""
    if block is None:
        return
    if not isinstance(block, dict):
        raise ConfigError(f"{path}: agent: must map agent settings to values")
    from kgsynth.agent.config import AgentConfig
    from kgsynth.core.config import alias_names

    known = {f.name for f in dataclasses.fields(AgentConfig)} | set(alias_names(AgentConfig))
    unknown = [str(k) for k in block if str(k).replace("-", "_") not in known]
    if unknown:
        raise ConfigError(
            f"{path}: agent: unknown setting {unknown[0]!r}; valid: {', '.join(sorted(known))}"
        )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def plan(recipe_path: Path, opts: RunOptions) -> list[Step]:
    """The recipe's steps as command lines, in order, every path derived from ``opts.out``."""
    recipe = load_recipe(recipe_path)
    sized = size_flags(recipe_path, recipe, opts.size)
    run = opts.out.absolute()
    outputs: dict[str, Path | str] = {}  # a step's output; the KG may be a URL
    steps: list[Step] = []
    for index, raw in enumerate(recipe["steps"]):
        where = f"{recipe_path}: steps[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ConfigError(f"{where}: a step is a mapping with a name and a run")
        name, command = raw["name"], raw.get("run")
        if command not in COMMANDS:
            raise ConfigError(f"{where} ({name}): run must be one of {', '.join(COMMANDS)}")
        if name in outputs:
            raise ConfigError(f"{where}: a second step named {name!r}")
        flags = {k: v for k, v in raw.items() if k not in _RESERVED}
        flags |= sized.get(name, {})
        if command == "synthesize questions" and opts.llm:
            flags |= opts.llm
        if command == "train stage1" and opts.model:
            flags["model"] = opts.model
        needs_eval = any("{eval_questions}" in str(v) for k, v in flags.items() if k != "benchmark")
        if needs_eval and opts.eval_questions is None:
            continue  # an evaluation on a KG that came without questions
        if opts.eval_questions is None:
            flags.pop("benchmark", None)
        if command == "kg import" and not _needs_import(opts.kg):
            outputs[name] = opts.kg  # an endpoint, or a store made before: used as it is
            continue
        out = run / str(raw.get("out", DEFAULT_OUT[command])).format(name=name)
        resolve = _resolver(run, opts, outputs)
        argv = command.split() if command != "compare" else ["eval"]
        if command == "kg import":
            argv.append(opts.kg)
        if command == "kg stats":
            argv += ["--kg", str(resolve("kg", flags.pop("kg", "kg")))]
        if command == "report":
            argv.append(str(run))
        if command == "compare":
            of = flags.pop("of", [])
            present = [str(outputs[s]) for s in of if s in outputs]
            if not present:
                continue  # nothing was evaluated
            argv += ["--compare", *present]
        section = raw.get("section", name)
        settings: dict[str, Any] = {}
        if command not in SECTIONLESS and isinstance(recipe.get(section), dict):
            argv += ["--config", str(recipe_path.absolute()), "--section", section]
            settings = recipe[section]
        for key, value in flags.items():
            argv += _flag_args(key, value, resolve)
        if command in TRAINING and opts.nproc > 1:
            argv += ["--nproc-per-node", str(opts.nproc), "--master-port", "0"]
        if opts.nproc > 1 and _generates_with_policy(command, flags):
            argv += ["--workers", str(opts.nproc)]
        stdout_to = None
        if command == "kg stats":
            argv.append("--json")
            stdout_to = out
        elif command != "report":
            argv += ["--out", str(out), "--overwrite"]
        else:
            argv += ["--overwrite"]
        folder = command in ("kg import", "filter", "eval", "compare") or command in TRAINING
        steps.append(Step(name, command, out, argv, folder, stdout_to, settings))
        outputs[name] = out
    return steps


def size_flags(recipe_path: Path, recipe: dict[str, Any], size: str | None) -> dict[str, Any]:
    """The step flags of the recipe's size ``size``: ``smoke:``, or one under ``sizes:``
    (none: the recipe as written, {})."""
    sizes = recipe.get("sizes") or {}
    if not isinstance(sizes, dict):
        raise ConfigError(f"{recipe_path}: sizes: must map size names to step flags")
    sizes = {**sizes, "smoke": recipe["smoke"]} if "smoke" in recipe else sizes
    if size is None:
        return {}
    if size not in sizes:
        known = ", ".join(sorted(sizes)) or "none"
        raise ConfigError(f"{recipe_path}: no size {size!r}; its sizes: {known}")
    flags = sizes[size] or {}
    where = f"{recipe_path}: {'smoke' if size == 'smoke' else 'sizes: ' + size}"
    if not isinstance(flags, dict) or not all(isinstance(v, dict) for v in flags.values()):
        raise ConfigError(f"{where}: must map step names to flags")
    steps = {s.get("name") for s in recipe["steps"] if isinstance(s, dict)}
    unknown = sorted(str(k) for k in flags if k not in steps)
    if unknown:
        raise ConfigError(f"{where}: no step {unknown[0]!r} in the recipe's steps:")
    return flags


def _needs_import(source: str) -> bool:
    """A triple file is imported into the run; an endpoint URL or a store directory is not."""
    from kgsynth.kg.embedded import is_store_dir

    return "://" not in source and not is_store_dir(Path(source))


def _generates_with_policy(command: str, flags: dict[str, Any]) -> bool:
    """Steps whose policy generates on the CPU in worker processes: eval, and trajectories
    written by a local checkpoint."""
    return command == "eval" or (command == "synthesize trajectories" and flags.get("llm") == "hf")


def _resolver(run: Path, opts: RunOptions, outputs: dict[str, Path | str]):
    def resolve(key: str, value: str) -> str:
        text = str(value)
        subs = {"kg": opts.kg, "run": str(run), "eval_questions": str(opts.eval_questions)}
        if _PLACEHOLDER.search(text):
            return _PLACEHOLDER.sub(lambda m: subs[m.group(1)], text)
        head, _, rest = text.partition("/")
        if head in outputs:
            return f"{outputs[head]}/{rest}" if rest else str(outputs[head])
        if key in AS_GIVEN or Path(text).is_absolute():
            return text
        return str(run / text)

    return resolve


def _flag_args(key: str, value: Any, resolve) -> list[str]:
    """``--key value`` (a list repeats the flag; true is the bare flag, false ``--no-key``)."""
    if isinstance(value, bool):
        return [_flag(key)] if value else ["--no-" + key.replace("_", "-")]
    if isinstance(value, list):
        return [arg for item in value for arg in _flag_args(key, item, resolve)]
    text = resolve(key, value) if key in PATH_FLAGS else str(value)
    return [_flag(key), text]


__all__ = ["COMMANDS", "DEFAULT_OUT", "RunOptions", "Step", "load_recipe", "plan", "size_flags"]
