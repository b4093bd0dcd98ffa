"""Launchable GRPO worker: ``deepspeed train/rl.py OUT/rl_spec.json`` or
``torchrun --nproc_per_node N train/rl.py OUT/rl_spec.json``.

The spec (``kind: rl``) is what ``kgsynth train rl --nproc-per-node N`` writes into its run
folder before it starts the launcher; this script is the same worker as
``python -m kgsynth.train.launch``. Each process rolls out its share of the step's groups and
all step together (see ``kgsynth/train/grpo.py``)."""

import sys

from kgsynth.train.launch import main

if __name__ == "__main__":
    sys.exit(main())
