"""The ``kgsynth`` command line (``kgsynth.cli:app``): options in, a stage called, outputs
and one-line errors out; the stages' work lives in the library."""

from kgsynth.cli.app import app

__all__ = ["app"]
