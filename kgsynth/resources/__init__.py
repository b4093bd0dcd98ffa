"""What kgsynth ships inside the package, found through :mod:`importlib.resources` wherever
kgsynth is installed (a checkout, a wheel, a site-packages folder):

- ``prompts/``: the prompt templates (``*.j2``, :mod:`kgsynth.prompts` renders them);
- ``recipes/``: the run recipes (``*.yaml``; ``kgsynth run NAME``, ``kgsynth recipes``);
- ``deepspeed/``: the DeepSpeed ZeRO configs (``--deepspeed zero2``) and their README;
- ``metaqa/``: the default KG (the MetaQA movie KB, ``kb_partial.txt.gz``), its dev and check
  question samples, licence and source.

A user names a packaged recipe or DeepSpeed config by its name (``metaqa_default``,
``zero2``) or gives a path to a file of their own. The paths of a checkout before the files
moved here (``pipelines/metaqa_default.yaml``, ``train/ds_zero2.json``) still name the packaged
file when no file is at that path; the resolver says so in a note.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from kgsynth.core.errors import ConfigError

log = logging.getLogger(__name__)

RECIPE_SUFFIX = ".yaml"
DEEPSPEED_PREFIX, DEEPSPEED_SUFFIX = "ds_", ".json"
OLD_RECIPE_FOLDER = "pipelines"  # where recipes lived in a checkout before they were packaged
OLD_DEEPSPEED_FOLDER = "train"  # where the DeepSpeed configs lived
RENAMED_RECIPES = {"kbqa_r1": "kbqa-r1"}  # a recipe's earlier name: its name now

_noted: set[str] = set()  # the old paths a note was given for in this process
_extracted = contextlib.ExitStack()  # files copied out of a zipped install, removed at exit
atexit.register(_extracted.close)


def resource(*parts: str) -> Path:
    """A packaged file or folder as a path on disk (``resource("metaqa", "kb_partial.txt.gz")``).

    An installed wheel's resources are files already; only a zipped install copies them out
    (kept until the process ends)."""
    target = resources.files(__name__).joinpath(*parts)
    if isinstance(target, Path):
        return target
    return _extracted.enter_context(resources.as_file(target))


def prompts_dir() -> Path:
    """The folder of the packaged prompt templates."""
    return resource("prompts")


def metaqa_dir() -> Path:
    """The folder of the shipped MetaQA movie KB and its question samples."""
    return resource("metaqa")


def default_kg() -> Path:
    """The default KG: the MetaQA movie KB (a gzipped ``s|r|o`` triple file)."""
    return resource("metaqa", "kb_partial.txt.gz")


def dev_sample() -> Path:
    """The 300 MetaQA dev questions ``make all`` evaluates on."""
    return resource("metaqa", "dev_sample", "metaqa_dev_sample.jsonl")


def dev_check() -> Path:
    """300 other MetaQA dev questions, none in :func:`dev_sample` (``make dev-check``)."""
    return resource("metaqa", "dev_check", "metaqa_dev_check.jsonl")


def recipe_names() -> list[str]:
    """The packaged recipes' names, sorted (``metaqa_default``, …)."""
    folder = resources.files(__name__).joinpath("recipes")
    names = (e.name for e in folder.iterdir() if e.name.endswith(RECIPE_SUFFIX))
    return sorted(n.removesuffix(RECIPE_SUFFIX) for n in names)


def recipe_description(name: str) -> str:
    """A packaged recipe's one-line description: its first comment line."""
    text = resources.files(__name__).joinpath("recipes", name + RECIPE_SUFFIX).read_text("utf-8")
    for line in text.splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.lstrip("#").strip()
    return ""


def deepspeed_names() -> list[str]:
    """The packaged DeepSpeed configs' short names, sorted (``zero0``, ``zero2``, ``zero3``)."""
    folder = resources.files(__name__).joinpath("deepspeed")
    names = (e.name for e in folder.iterdir() if e.name.startswith(DEEPSPEED_PREFIX))
    return sorted(n.removeprefix(DEEPSPEED_PREFIX).removesuffix(DEEPSPEED_SUFFIX) for n in names)


def find_recipe(
    value: str | Path, note: Callable[[str], None] | None = None, *, flag: str = "recipe"
) -> Path:
    """The recipe ``value`` names: a YAML file, or a packaged recipe by name (``metaqa_default``
    or ``metaqa_default.yaml``); a checkout's old ``pipelines/NAME.yaml`` where no such file
    is names the packaged one (``note`` gets a line saying so). Anything else is a
    :class:`ConfigError` naming ``flag`` and listing the packaged names. A recipe's earlier
    name (:data:`RENAMED_RECIPES`: ``kbqa_r1``) names the recipe by its new name."""
    return _find(
        str(value),
        flag=flag,
        what="recipe",
        names=recipe_names(),
        packaged=lambda name: resource("recipes", name + RECIPE_SUFFIX),
        short=_recipe_name,
        old_folder=OLD_RECIPE_FOLDER,
        note=note,
    )


def _recipe_name(text: str) -> str:
    """A recipe file's name as a packaged recipe's name, an earlier name as the name now."""
    name = text.removesuffix(RECIPE_SUFFIX)
    return RENAMED_RECIPES.get(name, name)


def find_deepspeed(
    value: str | Path, note: Callable[[str], None] | None = None, *, flag: str = "--deepspeed"
) -> Path:
    """The DeepSpeed config ``value`` names: a JSON file, or a packaged config (``zero2``,
    ``ds_zero2`` or ``ds_zero2.json``); a checkout's old ``train/ds_zeroN.json`` where no such
    file is names the packaged one (``note`` gets a line saying so). Anything else is a
    :class:`ConfigError` naming ``flag`` and listing the packaged names."""
    return _find(
        str(value),
        flag=flag,
        what="DeepSpeed config",
        names=deepspeed_names(),
        packaged=lambda name: resource("deepspeed", DEEPSPEED_PREFIX + name + DEEPSPEED_SUFFIX),
        short=lambda text: text.removesuffix(DEEPSPEED_SUFFIX).removeprefix(DEEPSPEED_PREFIX),
        old_folder=OLD_DEEPSPEED_FOLDER,
        note=note,
    )


def _find(
    text: str,
    *,
    flag: str,
    what: str,
    names: list[str],
    packaged: Callable[[str], Path],
    short: Callable[[str], str],
    old_folder: str,
    note: Callable[[str], None] | None,
) -> Path:
    path = Path(text)
    if path.is_file():
        return path
    bare = path.name == text  # a name, not a path
    name = short(path.name)
    if name in names and (bare or path.parent.name == old_folder):
        found = packaged(name)
        line = f"{flag}: {text} is now the packaged {what} {name!r} (give the name: {name})"
        if not bare and line not in _noted:  # once a process: a config is read more than once
            _noted.add(line)
            (note or log.warning)(line)
        return found
    if path.exists():
        where = "a folder, not a file"
    else:
        where = "no such file" if not bare else f"no packaged {what} of that name"
    raise ConfigError(f"{flag}: {text}: {where}; packaged {what}s: {', '.join(names)}")


__all__ = [
    "deepspeed_names",
    "default_kg",
    "dev_check",
    "dev_sample",
    "find_deepspeed",
    "find_recipe",
    "metaqa_dir",
    "prompts_dir",
    "recipe_description",
    "recipe_names",
    "resource",
]
