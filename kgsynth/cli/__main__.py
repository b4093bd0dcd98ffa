"""``python -m kgsynth.cli``: the same as the ``kgsynth`` command."""

from kgsynth.cli.app import app

app()
