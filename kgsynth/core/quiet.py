"""A quiet terminal by default: the libraries kgsynth trains and samples with stay silent below
an error unless ``kgsynth -v`` asks for their output.

:func:`configure_output` is called once per process by every entry point: the CLI (each
``kgsynth`` command, also the recipe runner's steps, which are ``kgsynth`` processes) and the
workers a launcher starts (``python -m kgsynth.train.launch``). Quiet, it

- sets the environment variables Hugging Face's libraries read at import (no progress bars
  from the hub, transformers or datasets; their loggers at ``error``), so that every process
  kgsynth starts inherits them, and turns the bars off in a library already imported;
- raises the third-party loggers to ERROR, and drops DeepSpeed's records below ERROR through a
  filter on its logger (DeepSpeed sets that logger's level and handler itself at import, so a
  level set here would not last; its "Setting accelerator to CPU" is a warning);
- hides Python warnings raised from any module outside ``kgsynth`` (a ``FutureWarning`` of
  transformers in LoRA runs).

``KGSYNTH_VERBOSE=1`` in the environment is how ``-v`` reaches the processes kgsynth starts:
:func:`configure_output` sets it when verbose, and every entry point reads it as the process
found it at start (:func:`verbose_from_environment`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

VERBOSE_ENV = "KGSYNTH_VERBOSE"

# read by the libraries when they are imported (set before that; inherited by subprocesses)
QUIET_ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # the hub's bars, which transformers' follow
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "DATASETS_VERBOSITY": "error",
}

THIRD_PARTY_LOGGERS = (
    "transformers",
    "datasets",
    "huggingface_hub",
    "accelerate",
    "peft",
    "trl",
    "sentence_transformers",
    "torch",
    "httpx",
    "openai",
    "urllib3",
    "filelock",
    "matplotlib",
    "PIL",
)
DEEPSPEED_LOGGER = "DeepSpeed"
# a warning is attributed to the module that raised it (or the caller its stacklevel names)
_OUTSIDE_KGSYNTH = re.compile(r"(?!kgsynth(\.|$))")


def _is_not(entry: tuple, hide: tuple) -> bool:
    action, message, category, module, lineno = entry
    pattern = getattr(module, "pattern", module)
    return (action, message, category, pattern, lineno) != (*hide[:3], hide[3].pattern, hide[4])


class _ErrorsOnly(logging.Filter):
    """Passes records of ERROR and above (a logger whose level its library resets)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


# -v of the process that started this one: the environment as this process found it (a value
# this process sets is for the processes it starts, not for a later command run in it)
_FROM_PARENT = os.environ.get(VERBOSE_ENV, "") not in ("", "0")
_SET_HERE: set[str] = set()  # the variables of QUIET_ENVIRONMENT this process set


def verbose_from_environment() -> bool:
    """Whether the kgsynth process that started this one was run with ``-v``."""
    return _FROM_PARENT


def configure_output(verbose: bool) -> None:
    """Quiet third-party output (see the module docstring), or with ``verbose`` let it show,
    for this process and the ones it starts. A later call undoes an earlier one (tests run
    several commands in one process)."""
    deepspeed = logging.getLogger(DEEPSPEED_LOGGER)
    for f in [f for f in deepspeed.filters if isinstance(f, _ErrorsOnly)]:
        deepspeed.removeFilter(f)
    hide = ("ignore", None, Warning, _OUTSIDE_KGSYNTH, 0)
    warnings.filters[:] = [f for f in warnings.filters if _is_not(f, hide)]
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        for key in _SET_HERE:
            os.environ.pop(key, None)
        _SET_HERE.clear()
        for name in THIRD_PARTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        # kgsynth's INFO is progress; the plotting libraries' INFO is font-cache chatter
        for name in ("matplotlib", "PIL"):
            logging.getLogger(name).setLevel(logging.WARNING)
        _library_output(shown=True)
        return
    os.environ.pop(VERBOSE_ENV, None)
    for key, value in QUIET_ENVIRONMENT.items():
        if key not in os.environ:  # a value the user set wins
            os.environ[key] = value
            _SET_HERE.add(key)
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    deepspeed.addFilter(_ErrorsOnly())
    warnings.filterwarnings("ignore", module=_OUTSIDE_KGSYNTH.pattern)
    _library_output(shown=False)


def _library_output(shown: bool) -> None:
    """The environment is read at import: a library imported before this call is told."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import utils as hub_utils

        (hub_utils.enable_progress_bars if shown else hub_utils.disable_progress_bars)()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
        (hf_logging.set_verbosity_warning if shown else hf_logging.set_verbosity_error)()
    if "datasets" in sys.modules:
        from datasets.utils import logging as ds_logging

        (ds_logging.enable_progress_bar if shown else ds_logging.disable_progress_bar)()
        (ds_logging.set_verbosity_warning if shown else ds_logging.set_verbosity_error)()
