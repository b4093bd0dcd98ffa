"""A corpus folder's dataset card: ``README.md`` with Hugging Face ``datasets`` front matter.

``kgsynth filter`` writes it beside ``accepted.parquet`` and ``rejected.parquet``
(:func:`write_card`, into the same staged output as the Parquet files, so it is committed with
them). The front matter names the files (``configs``), their columns and types as read from the
Parquet schemas (``dataset_info.features``), their row counts, a ``license`` and, under
``kgsynth``, where the rows came from: the KG, the question and trajectory generators, the
filter's settings, kgsynth's version and commit. ``datasets.load_dataset(folder)`` loads the
accepted rows as the ``train`` split of the default config; the rejects are config
``rejected``. docs/corpus-format.md describes the format the card summarises::

    write_card(staged.path("README.md"), {"accepted.parquet": ..., "rejected.parquet": ...},
               manifest, input_paths)
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from kgsynth.core.stage_io import sidecar

CARD_NAME = "README.md"

# datasets' dtype names for the Arrow types a kgsynth table holds
_DTYPES: dict[pa.DataType, str] = {
    pa.string(): "string",
    pa.large_string(): "large_string",
    pa.bool_(): "bool",
    pa.int8(): "int8",
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.uint8(): "uint8",
    pa.uint16(): "uint16",
    pa.uint32(): "uint32",
    pa.uint64(): "uint64",
    pa.float16(): "float16",
    pa.float32(): "float32",
    pa.float64(): "float64",
    pa.binary(): "binary",
    pa.large_binary(): "large_binary",
    pa.date32(): "date32",
}

# Licence phrases -> the Hub's licence ids. More specific phrases come first (BY-SA before BY).
_LICENCES: tuple[tuple[str, str], ...] = (
    (r"attribution[- ]sharealike 4\.0|cc[- ]by[- ]sa[- ]4\.0", "cc-by-sa-4.0"),
    (r"attribution[- ]sharealike 3\.0|cc[- ]by[- ]sa[- ]3\.0", "cc-by-sa-3.0"),
    (r"attribution 4\.0|cc[- ]by[- ]4\.0", "cc-by-4.0"),
    (r"attribution 3\.0|cc[- ]by[- ]3\.0", "cc-by-3.0"),
    (r"attribution 2\.5|cc[- ]by[- ]2\.5", "cc-by-2.5"),
    (r"\bcc0\b|public domain dedication", "cc0-1.0"),
    (r"apache license,? version 2\.0|\bapache-2\.0\b", "apache-2.0"),
    (r"\bmit license\b", "mit"),
)
# Files beside a KG's source that may state its licence: notes are read on their licence lines
# only, licence files whole.
_LICENCE_NOTES = ("SOURCE.md", "README.md")
_LICENCE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "LICENCE.txt", "COPYING")


def arrow_features(schema: pa.Schema) -> list[dict[str, Any]]:
    """``schema`` as ``datasets``' YAML feature list (``dataset_info.features``)."""
    return [{"name": f.name, **_feature(f.type, f.name)} for f in schema]


def _feature(t: pa.DataType, where: str) -> dict[str, Any]:
    """One Arrow type as a YAML feature body: ``dtype``, ``list`` or ``struct``."""
    if t in _DTYPES:
        return {"dtype": _DTYPES[t]}
    if pa.types.is_timestamp(t):
        return {"dtype": f"timestamp[{t.unit}]" + (f", tz={t.tz}" if t.tz else "")}
    if pa.types.is_struct(t):
        return {"struct": [{"name": f.name, **_feature(f.type, f"{where}.{f.name}")} for f in t]}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        key = "large_list" if pa.types.is_large_list(t) else "list"
        inner = _feature(t.value_type, f"{where}[]")
        # datasets writes a list of a plain type or of a struct without the inner key
        if list(inner) == ["dtype"]:
            return {key: inner["dtype"]}
        if list(inner) == ["struct"]:
            return {key: inner["struct"]}
        return {key: inner}
    raise ValueError(f"column {where}: Arrow type {t} has no datasets feature in the card")


def _read_json(path: Path) -> dict[str, Any] | None:
    """A manifest, or None where there is none or it does not parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def kg_licence(source: str | None) -> tuple[str | None, str | None]:
    """The Hub licence id of a KG read from ``source`` and the file that says so, from a licence
    note or file beside the source; ``(None, None)`` where none names a licence kgsynth knows."""
    if not source or "://" in source:
        return None, None
    folder = Path(source).parent
    for name in (*_LICENCE_NOTES, *_LICENCE_FILES):
        path = folder / name
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if name in _LICENCE_NOTES:
            text = "\n".join(line for line in text.splitlines() if "licen" in line.lower())
        for pattern, licence in _LICENCES:
            if re.search(pattern, text, re.IGNORECASE):
                return licence, name
    return None, None


def _generators(table: pa.Table) -> list[dict[str, Any]]:
    """The trajectory generators of a corpus's rows (``generator`` column) with their counts."""
    if "generator" not in table.column_names:
        return []
    counts: Counter[tuple[str, str]] = Counter()
    for g in table.column("generator").to_pylist():
        g = g or {}
        counts[(g.get("backend") or "unknown", g.get("model") or "unknown")] += 1
    return [
        {"backend": backend, "model": model, "rows": rows}
        for (backend, model), rows in sorted(counts.items())
    ]


def _kg_entry(kg: Mapping[str, Any]) -> dict[str, Any]:
    """What the card says about a KG: its source file's name and digest, its size, its licence."""
    source = kg.get("source") or kg.get("location")
    licence, said_by = kg_licence(kg.get("source"))
    entry = {
        "name": Path(str(source)).name if source and "://" not in str(source) else source,
        "backend": kg.get("backend"),
        "profile": kg.get("profile"),
        "source_sha256": kg.get("source_sha256"),
        "triples": kg.get("triples"),
        "entities": kg.get("entities"),
        "relations": kg.get("relations"),
        "license": licence,
        "license_from": said_by,
    }
    return {k: v for k, v in entry.items() if v is not None}


def _input_entry(path: Path) -> dict[str, Any]:
    """One ``--in`` trajectory file's provenance, from its manifest and its questions'."""
    entry: dict[str, Any] = {"file": path.name}
    traj = _read_json(sidecar(path, "manifest.json"))
    if traj is None:
        entry["manifest"] = "none found beside the file"
        return entry
    cfg = traj.get("config") or {}
    entry["stage"] = traj.get("stage")
    entry["mode"] = cfg.get("mode")
    entry["toolset"] = cfg.get("toolset") or (cfg.get("agent") or {}).get("toolset")
    if traj.get("kg"):
        entry["kg"] = _kg_entry(traj["kg"])
    llm = traj.get("llm") or {}
    if llm:
        entry["trajectory_llm"] = {"backend": llm.get("backend"), "model": llm.get("model")}
    questions_path = (traj.get("input") or {}).get("questions")
    if questions_path:
        entry["questions_file"] = Path(questions_path).name
        questions = _read_json(sidecar(Path(questions_path), "manifest.json")) or {}
        generator = questions.get("generator") or questions.get("llm") or {}
        if generator:
            entry["question_llm"] = {
                "backend": generator.get("backend"),
                "model": generator.get("model"),
            }
    entry["kgsynth_version"] = (traj.get("versions") or {}).get("kgsynth")
    entry["git_sha"] = traj.get("git_sha")
    return {k: v for k, v in entry.items() if v is not None}


def _recipe(command: str) -> dict[str, str]:
    """The ``--config`` recipe file's name and ``--section`` of the filter's command line."""
    try:
        argv = shlex.split(command or "")
    except ValueError:
        return {}
    out = {}
    for flag, key in (("--config", "recipe"), ("--section", "section")):
        if flag in argv[:-1]:
            value = argv[argv.index(flag) + 1]
            out[key] = Path(value).name if key == "recipe" else value
    return out


def provenance(
    manifest: Mapping[str, Any], inputs: Sequence[Path], accepted: pa.Table
) -> dict[str, Any]:
    """Where a corpus came from: its inputs (KG, question and trajectory generators), the
    filter's settings and counts, kgsynth's version and commit."""
    out: dict[str, Any] = {
        "kgsynth_version": (manifest.get("versions") or {}).get("kgsynth"),
        "git_sha": manifest.get("git_sha"),
        "written": manifest.get("written"),
        **_recipe(str(manifest.get("command") or "")),
        "inputs": [_input_entry(Path(p)) for p in inputs],
        "trajectory_generators": _generators(accepted),
        "filter": {
            "config": manifest.get("config"),
            "rows_in": manifest.get("rows_in"),
            "accepted": manifest.get("accepted"),
            "rejected": manifest.get("rejected"),
            "rejects": manifest.get("rejects"),
        },
    }
    return {k: v for k, v in out.items() if v not in (None, [], {})}


def _licence(inputs: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The corpus's ``license`` id and the sentence that explains it."""
    kgs = [i.get("kg") or {} for i in inputs]
    found = {k.get("license") for k in kgs}
    names = ", ".join(sorted({str(k.get("name", "?")) for k in kgs})) or "unknown"
    if len(found) == 1 and None not in found:
        licence = found.pop()
        return str(licence), (
            f"The KG ({names}) is licensed `{licence}` (stated in "
            f"{', '.join(sorted({str(k.get('license_from')) for k in kgs}))} beside its source); "
            "the corpus is derived from it and carries the same licence. The terms of the LLMs "
            "that wrote questions or trajectories may add conditions."
        )
    return "other", (
        f"Unknown: kgsynth found no licence it recognises for the KG ({names}) in a licence "
        "file or SOURCE.md beside its source, so `license` is `other`. The corpus is derived "
        "from the KG (and from the LLMs that wrote its questions and trajectories); set "
        "`license` to the KG's licence before publishing it."
    )


def card_front_matter(
    files: Mapping[str, Path], manifest: Mapping[str, Any], inputs: Sequence[Path]
) -> dict[str, Any]:
    """The card's YAML front matter; ``files`` maps a corpus file's name to where it is now."""
    # the generator column alone: a corpus may be large
    columns = [c for c in ("generator",) if c in pq.read_schema(files["accepted.parquet"]).names]
    accepted = pq.read_table(files["accepted.parquet"], columns=columns)
    prov = provenance(manifest, inputs, accepted)
    licence, _ = _licence(prov.get("inputs", []))
    configs, infos, counts = [], [], {}
    for name, path in files.items():
        meta = pq.ParquetFile(path)
        rows = meta.metadata.num_rows
        counts[name] = rows
        # datasets makes no split of a file without rows, so an empty one is no config
        if rows == 0:
            continue
        config = "default" if name == "accepted.parquet" else Path(name).stem
        configs.append({"config_name": config, "data_files": [{"split": "train", "path": name}]})
        infos.append(
            {
                "config_name": config,
                "features": arrow_features(meta.schema_arrow),
                "splits": [{"name": "train", "num_examples": rows}],
            }
        )
    unknown = {"license_name": "unknown"} if licence == "other" else {}
    return {
        "license": licence,
        **unknown,
        "pretty_name": "kgsynth KG-agent SFT corpus",
        "task_categories": ["text-generation", "question-answering"],
        "tags": ["kgsynth", "knowledge-graph", "tool-use", "agent", "sft", "synthetic"],
        "configs": configs,
        "dataset_info": infos,
        "kgsynth": {"rows": counts, **prov},
    }


def _body(front: Mapping[str, Any], licence_text: str) -> str:
    """The card's Markdown after the front matter."""
    meta = front["kgsynth"]
    rows = meta["rows"]
    lines = [
        "# kgsynth KG-agent SFT corpus",
        "",
        "Tool-calling trajectories of an agent answering questions over a knowledge graph, "
        "synthesized and filtered by kgsynth "
        f"{meta.get('kgsynth_version', '')} (commit {meta.get('git_sha') or 'unknown'}).",
        "",
        "| file | rows | config | what |",
        "|---|---|---|---|",
    ]
    what = {
        "accepted.parquet": "the SFT corpus: trajectories that passed every filter",
        "rejected.parquet": "trajectories the filter rejected, each with its `reject_reason`",
    }
    for name, n in rows.items():
        config = "default" if name == "accepted.parquet" else Path(name).stem
        lines.append(f"| `{name}` | {n:,} | {config if n else '(empty)'} | {what.get(name, '')} |")
    lines += [
        "",
        "```python",
        "import datasets",
        "",
        'corpus = datasets.load_dataset("path/to/this/folder", split="train")',
        "```",
        "",
        "`messages` holds each trajectory as chat messages: `system` (the agent's tools), "
        "`user` (the question), `assistant` (the agent's turns: `<think>`, a `<kg-query>` tool "
        "call or the final `<answer>`) and `tool` (the KG's `<information>` observation). "
        "kgsynth renders a `tool` message as a `user` turn, as its agent sees it, and trains "
        "on the assistant turns only (their content and end-of-turn token). The chat template "
        "kgsynth gives the models it trains does both and marks the assistant tokens with "
        "`{% generation %}`, so TRL's `SFTTrainer(..., args=SFTConfig(assistant_only_loss=True))` "
        "trains on the same tokens. kgsynth's docs/corpus-format.md describes every column.",
        "",
        "## Provenance",
        "",
    ]
    for entry in meta.get("inputs", []):
        kg = entry.get("kg", {})
        lines.append(
            f"- `{entry['file']}`: {entry.get('mode', '?')} trajectories, tool set "
            f"{entry.get('toolset', '?')}; KG {kg.get('name', '?')} ({kg.get('triples', '?')} "
            f"triples); questions by {_who(entry.get('question_llm'))}; trajectories by "
            f"{_who(entry.get('trajectory_llm'))}"
        )
    if "recipe" in meta:
        lines.append(f"- recipe: `{meta['recipe']}` (section {meta.get('section', 'filter')})")
    lines += [
        "- the filter's settings, counts per reject reason, the files' digests: front matter "
        "`kgsynth` and `manifest.json`",
        "",
        "## Licence",
        "",
        licence_text,
        "",
    ]
    return "\n".join(lines)


def _who(llm: Mapping[str, Any] | None) -> str:
    if not llm:
        return "unknown"
    return f"{llm.get('backend')} `{llm.get('model')}`"


def card_text(
    files: Mapping[str, Path], manifest: Mapping[str, Any], inputs: Sequence[Path]
) -> str:
    """The whole ``README.md``: ``---``-fenced YAML front matter, then the Markdown."""
    front = card_front_matter(files, manifest, inputs)
    _, licence_text = _licence(front["kgsynth"].get("inputs", []))
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=100)
    return f"---\n{head}---\n\n{_body(front, licence_text)}"


def write_card(
    path: Path, files: Mapping[str, Path], manifest: Mapping[str, Any], inputs: Sequence[Path]
) -> Path:
    """Write the card to ``path`` (inside a staged output, or through a temporary file and a
    rename, so a reader never sees half of it). Returns ``path``."""
    text = card_text(files, manifest, inputs)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
