"""The agent a checkpoint carries: ``agent_config.json`` beside its weights and its
``agent_system_prompt.txt``.

Weights trained on trajectories answer well only in the tool environment they were trained in
(tool set, relation ranking, first-hop fallback, entity matching, turn and token caps, top-k,
resampling): on 300 held-out MetaQA questions one RL checkpoint scored Hits@1 0.82 / 0.54 /
0.08 under its recipe's settings and 0.013 / 0 / 0 under the defaults (issue 43). So every
training stage writes the :class:`~kgsynth.agent.config.AgentConfig` it trained under into the
model folder and each ``checkpoint-N`` (:func:`write_agent_file`), and every consumer (eval, RL
and its early stopping, stage 2's early stopping, free rollouts, ``kg tool --agent-from``)
starts from it: defaults < the checkpoint's agent < the ``--config`` section < flags, a
setting given over a different carried one named in one warning (:func:`override_line`).

Where an SFT stage's settings come from: the trajectories its corpus was made of.
:func:`corpus_agent` follows the corpus's manifest (``filter`` records its ``--in`` files) to
each ``synthesize trajectories`` manifest, whose resolved config holds the agent fields, and
takes field by field the value most corpus rows were made with (an oracle replay's turn-token
cap and resampling, which it never used, are not among them).

The file::

    {"format": 1,
     "agent": {"toolset": "graphwalker", "max_turns": 8, "relation_ranking": "focus", ...},
     "from": "the trajectories of runs/x/corpus/accepted.parquet"}

``agent`` holds the AgentConfig fields the settings are known for (a stage 1 of oracle replays
has no turn-token cap), never ``system_text`` (the prompt has its own file).
A folder without the file (an older run, a plain HF model) carries nothing: its consumers
behave as before.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import typing
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.agent.config import AGENT_FIELDS, AgentConfig, AgentConfigError
from kgsynth.core.config import type_problem
from kgsynth.core.errors import ConfigError, InputFileError

log = logging.getLogger(__name__)

AGENT_CONFIG_FILE = "agent_config.json"
FORMAT = 1
# the system prompt is stored as text of its own (kgsynth.agent.prompt.SYSTEM_PROMPT_FILE)
SAVED_FIELDS = tuple(name for name in AGENT_FIELDS if name != "system_text")
_MAX_DEPTH = 8  # filter outputs filtered again: a chain longer than this is not followed
# settings of a generating policy: an oracle replay generates nothing, so its manifest's values
# of these are defaults nothing was made with, not settings its trajectories teach
GENERATION_FIELDS = ("max_turn_tokens", "resample_cut_turns", "resample_temperature")


@dataclass(frozen=True)
class CarriedAgent:
    """Agent settings a model or a corpus carries: ``values`` by AgentConfig field name (all or
    some of :data:`SAVED_FIELDS`) and whose they are, as a warning names them: ``subject``
    ("the model runs/x/stage1") and ``verb`` ("was trained with")."""

    values: dict[str, Any]
    subject: str
    verb: str = "was trained with"
    # the agent settings the command itself sets over these (its flags, --config section or
    # preset; filled by kgsynth.cli.fields.config_command), carried or not
    given: tuple[str, ...] = ()

    @property
    def origin(self) -> str:
        return f"{self.subject} {self.verb}"


def agent_record(agent: AgentConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The saved fields of ``agent`` (an AgentConfig, or its fields by name)."""
    values = dataclasses.asdict(agent) if isinstance(agent, AgentConfig) else dict(agent)
    return {name: values[name] for name in SAVED_FIELDS if name in values}


def write_agent_file(
    folder: str | Path, agent: AgentConfig | Mapping[str, Any], origin: str | None = None
) -> Path:
    """``folder/agent_config.json`` for ``agent`` (written whole or not at all); ``origin``
    says where the settings came from (kept for people; consumers read ``agent``)."""
    path = Path(folder) / AGENT_CONFIG_FILE
    data: dict[str, Any] = {"format": FORMAT, "agent": agent_record(agent)}
    if origin:
        data["from"] = origin
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_agent_file(folder: str | Path | None) -> dict[str, Any] | None:
    """The agent settings ``folder`` carries (None without the file). A file that is not one
    is an error naming it; a key this version does not know (a later kgsynth's setting) is
    left out with a warning, so an older kgsynth still reads a newer checkpoint."""
    if not folder:
        return None
    path = Path(folder) / AGENT_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputFileError(
            path, f"unreadable agent settings ({exc}); delete it and the model carries none"
        ) from None
    agent = data.get("agent") if isinstance(data, dict) else None
    if not isinstance(agent, dict):
        raise InputFileError(path, 'holds no "agent" mapping of agent settings')
    if data.get("format", FORMAT) != FORMAT:
        log.warning("%s: format %r, not %d: written by another kgsynth; read as far as it "
                    "matches", path, data.get("format"), FORMAT)  # fmt: skip
    hints = typing.get_type_hints(AgentConfig)
    unknown = sorted(set(agent) - set(SAVED_FIELDS))
    if unknown:
        log.warning("%s: left out agent settings this kgsynth does not know: %s", path,
                    ", ".join(unknown))  # fmt: skip
    values = {k: v for k, v in agent.items() if k in SAVED_FIELDS}
    for name, value in values.items():
        problem = type_problem(value, hints[name])
        if problem:
            raise InputFileError(path, f"agent setting {name} {problem} (got {value!r})")
    try:
        AgentConfig(**values)
    except AgentConfigError as exc:
        raise InputFileError(path, f"invalid agent settings: {exc}") from None
    return values


def model_agent(model: str | Path | None) -> CarriedAgent | None:
    """What the model folder ``model`` was trained with, when it carries it."""
    values = read_agent_file(model) if model and Path(model).is_dir() else None
    return CarriedAgent(values, f"the model {model}") if values else None


# -- provenance of a corpus


def _manifest_of(path: Path) -> dict[str, Any] | None:
    """The manifest that describes the output file ``path``: its sidecar
    (``X.manifest.json``), or the manifest of the folder output it is part of (a filter's
    ``corpus/manifest.json``, whose output names it)."""
    from kgsynth.core.stage_io import sidecar

    folder = path.parent / "manifest.json"
    for candidate, own in ((sidecar(path, "manifest.json"), True), (folder, False)):
        try:
            data = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        outputs = data.get("output") if isinstance(data.get("output"), dict) else {}
        named = {Path(str(v)).name for v in outputs.values() if isinstance(v, str)}
        if own or path.name in named:
            return data
    return None


def _trajectory_ids(path: Path) -> Counter[str] | None:
    """The trajectory ids of a Parquet file, with their multiplicity (an upsampled corpus
    repeats rows); None when they cannot be read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        column = pq.read_table(path, columns=["trajectory_id"]).column("trajectory_id")
    except (OSError, pa.ArrowException):  # unreadable: its share is told by its row count
        return None
    return Counter(str(v) for v in column.to_pylist())


def _input_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """A filter manifest's ``--in`` files: path, sha256 and rows of each."""
    entry = manifest.get("input")
    if not isinstance(entry, dict):
        return []
    if isinstance(entry.get("files"), list):
        return [f for f in entry["files"] if isinstance(f, dict) and f.get("path")]
    if entry.get("path"):
        return [{"path": entry["path"], "sha256": entry.get("sha256"), "rows": entry.get("rows")}]
    return []


def _locate(entry: dict[str, Any], manifest_dir: Path) -> Path | None:
    """The file an input entry names: as recorded (relative to here), else relative to the
    folder of the manifest that names it or the folder above (a run moved whole); one whose
    contents changed since (another SHA-256 than recorded) is not it."""
    from kgsynth.core.manifest import sha256_file

    named = Path(str(entry["path"]))
    candidates = [named] if named.is_absolute() else [named, manifest_dir / named]
    if not named.is_absolute():
        candidates.append(manifest_dir.parent / named)
    sha = entry.get("sha256")
    changed = None
    for candidate in dict.fromkeys(candidates):
        if not candidate.is_file():
            continue
        if not isinstance(sha, str) or sha256_file(candidate) == sha:
            return candidate
        changed = candidate
    if changed is not None:
        log.warning("%s changed after the corpus was made from it: its agent settings are not "
                    "taken as the corpus's", changed)  # fmt: skip
    return None


def _votes(
    path: Path, ids: Counter[str] | None, rows: int, depth: int = 0
) -> list[tuple[dict[str, Any], int, Path]]:
    """``(agent settings, corpus rows, trajectories file)`` for each ``synthesize
    trajectories`` output the rows of ``path`` came from. ``ids``: the corpus rows'
    trajectory ids (None where unreadable, then each input weighs its recorded rows)."""
    manifest = _manifest_of(path)
    if manifest is None or depth > _MAX_DEPTH:
        return []
    stage = manifest.get("stage")
    config = manifest.get("config")
    if stage == "synthesize trajectories" and isinstance(config, dict):
        unused = GENERATION_FIELDS if config.get("mode") == "oracle" else ()
        values = {k: config[k] for k in SAVED_FIELDS if k in config and k not in unused}
        return [(values, rows, path)] if values and rows else []
    if stage != "filter":
        return []
    votes = []
    unclaimed = Counter(ids) if ids is not None else None
    for entry in _input_files(manifest):
        found = _locate(entry, path.parent)
        if found is None:
            continue
        theirs = _trajectory_ids(found)
        if unclaimed is not None and theirs is not None:
            # a row is the first input's that holds its id: the filter keeps the first of
            # repeated trajectories, in input order
            mine = Counter({k: n for k, n in unclaimed.items() if k in theirs})
            unclaimed -= mine
            weight = sum(mine.values())
        else:  # no ids to match: the file's own row count stands for its share
            mine, weight = None, int(entry.get("rows") or 0)
        if weight:
            votes += _votes(found, mine, weight, depth + 1)
    return votes


def corpus_agent(corpus: str | Path) -> CarriedAgent | None:
    """The agent settings the trajectories of ``corpus`` (a ``synthesize trajectories`` output
    or a ``filter`` output made of such files) were made with; None where no manifest says.

    Where the trajectory files disagree on a setting, the value most corpus rows were made with
    is taken (a tie: the earlier input's) and a warning names the setting and the counts."""
    path = Path(corpus)
    ids = _trajectory_ids(path)
    rows = sum(ids.values()) if ids is not None else 1
    votes = _votes(path, ids, rows)
    if not votes:
        return None
    values: dict[str, Any] = {}
    for name in SAVED_FIELDS:
        tally: dict[str, tuple[Any, int]] = {}
        for settings, weight, _ in votes:
            if name in settings:
                key = json.dumps(settings[name])
                value, n = tally.get(key, (settings[name], 0))
                tally[key] = (value, n + weight)
        if not tally:
            continue
        ranked = sorted(tally.values(), key=lambda vn: -vn[1])  # stable: ties keep input order
        values[name] = ranked[0][0]
        if len(ranked) > 1:
            log.warning(
                "the trajectories of %s were made with different %s (%s); its training run "
                "carries %s, what most of its rows were made with",
                path, name, ", ".join(f"{v!r}: {n} rows" for v, n in ranked), ranked[0][0],
            )  # fmt: skip
    return CarriedAgent(values, f"the trajectories of {path}", "were made with")


def sft_agent(corpus: str | Path, init: str | Path | None) -> CarriedAgent | None:
    """What an SFT run on ``corpus`` trains under, before its own options: the settings of the
    corpus's trajectories, and where they say nothing (no manifest, an older one) what
    ``init`` (stage 2's start) carries."""
    made = corpus_agent(corpus)
    start = model_agent(init) if init else None
    if made is None:
        return start
    if start is None:
        return made
    return CarriedAgent({**start.values, **made.values}, made.subject, made.verb)


# -- overriding what a model carries

ALLOW_TOOLSET_CHANGE = "allow_toolset_change"
ALLOW_TOOLSET_CHANGE_HELP = (
    "Run a model under a tool set (--toolset, a --preset's) other than the one it was trained "
    "with (its agent_config.json); without it that is refused."
)


def check_toolset_change(
    carried: CarriedAgent | None, given: Mapping[str, Any], how: str = "the command sets"
) -> None:
    """Refuse to run a model under a tool set other than the one it was trained with: where
    ``given`` (the options a command's preset, ``--config`` file and flags set, by field name)
    sets a ``toolset`` other than the one ``carried`` holds and not ``allow_toolset_change``,
    a :class:`ConfigError` names both tool sets and the flag that allows it (``how``: what set
    it, "--preset kg-r1 sets"). Its tools, turn format and prompt are another space's, so its
    answers measure or train something else."""
    if carried is None:
        return
    held, asked = carried.values.get("toolset"), given.get("toolset")
    if held is None or asked is None or asked == held or given.get(ALLOW_TOOLSET_CHANGE):
        return
    raise ConfigError(
        f"{carried.origin} toolset {held}; {how} toolset {asked}, a tool set it was not "
        f"trained with: pass --allow-toolset-change to run it so, or give --toolset {held}"
    )


def shown(value: Any) -> str:
    """A setting's value as a warning shows it (as YAML spells it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def overrides(
    carried: CarriedAgent, given: Iterable[tuple[str, Any, str]]
) -> list[tuple[str, Any, str]]:
    """The ``(field, value, how it was given)`` of ``given`` whose value differs from the one
    ``carried`` holds for that field (fields it does not hold are not overrides)."""
    return [
        (name, value, how)
        for name, value, how in given
        if name in carried.values and value != carried.values[name]
    ]


def override_line(carried: CarriedAgent, given: Iterable[tuple[str, Any, str]]) -> str | None:
    """One warning line naming each setting in ``given`` (``(field, value, how it was given)``
    with ``how`` as the user wrote it: ``--relation-ranking bm25``, ``max_turns 5 (--config
    r.yaml, section eval)``) that overrides a different value ``carried`` holds; None when
    nothing does::

        the model runs/x/stage1 was trained with relation_ranking focus; --relation-ranking
        bm25 overrides it
    """
    changed = overrides(carried, given)
    if not changed:
        return None
    held = _join([f"{name} {shown(carried.values[name])}" for name, _, _ in changed])
    hows = _join([how for _, _, how in changed])
    verb = "overrides it" if len(changed) == 1 else "override them"
    return f"{carried.origin} {held}; {hows} {verb}"


__all__ = [
    "AGENT_CONFIG_FILE",
    "ALLOW_TOOLSET_CHANGE",
    "ALLOW_TOOLSET_CHANGE_HELP",
    "SAVED_FIELDS",
    "CarriedAgent",
    "agent_record",
    "check_toolset_change",
    "corpus_agent",
    "model_agent",
    "override_line",
    "overrides",
    "read_agent_file",
    "sft_agent",
    "shown",
    "write_agent_file",
]
