"""Training: SFT stages (:mod:`kgsynth.train.sft`), their data (:mod:`kgsynth.train.data`) and
multi-process launch (:mod:`kgsynth.train.launch`). Importing this package loads no torch."""
