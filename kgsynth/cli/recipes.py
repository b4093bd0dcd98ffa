"""``kgsynth recipes [NAME]``: the recipes and DeepSpeed configs kgsynth ships, by name.

Without a name it lists each packaged recipe with its one-line description (``kgsynth run
NAME`` runs one) and the DeepSpeed configs ``--deepspeed NAME`` takes; with a name it prints
that file to stdout, to write it out and edit it::

    kgsynth recipes
    kgsynth recipes metaqa_default > my.yaml     # edit, then: kgsynth run my.yaml --out RUN
    kgsynth recipes zero2 > my_zero2.json        # then: kgsynth train … --deepspeed my_zero2.json
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kgsynth.cli.common import fail, stdout
from kgsynth.core.errors import ConfigError


def recipes_cmd(
    name: Annotated[
        str | None,
        typer.Argument(
            help="A packaged recipe (metaqa_default) or DeepSpeed config (zero2) to print.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """List the packaged recipes (kgsynth run NAME) and DeepSpeed configs (--deepspeed NAME);
    with a NAME, print that file to stdout to save and edit."""
    from kgsynth import resources

    recipes, zero = resources.recipe_names(), resources.deepspeed_names()
    if name is None:
        width = max(map(len, recipes))
        for recipe in recipes:
            line = f"{recipe:<{width}}  {resources.recipe_description(recipe)}"
            stdout.print(line, highlight=False, markup=False, soft_wrap=True)
        stdout.print(
            f"DeepSpeed configs (--deepspeed NAME): {', '.join(zero)}. "
            "`kgsynth recipes NAME` prints one.",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return
    try:
        if name.removesuffix(".yaml") in recipes:
            path = resources.find_recipe(name)
        elif name.removesuffix(".json").removeprefix("ds_") in zero:
            path = resources.find_deepspeed(name)
        else:
            raise ConfigError(
                f"recipes: no packaged recipe or DeepSpeed config {name!r}; recipes: "
                f"{', '.join(recipes)}; DeepSpeed configs: {', '.join(zero)}"
            )
    except ConfigError as exc:
        fail(exc)
    sys.stdout.write(path.read_text(encoding="utf-8"))
    sys.stdout.flush()


__all__ = ["recipes_cmd"]
