"""Launchable SFT worker: ``deepspeed train/sft.py OUT/train_config.json`` or
``torchrun --nproc_per_node N train/sft.py OUT/train_config.json``.

The spec is the resolved run that ``kgsynth train stage1|stage2 ... --dry-run`` describes and
``kgsynth train`` writes into the run folder; this script is the same worker as
``python -m kgsynth.train.launch``."""

import sys

from kgsynth.train.launch import main

if __name__ == "__main__":
    sys.exit(main())
