"""Training the agent policy: SFT (stage 1 and 2) and GRPO (RL). Importing it loads no torch.

- :mod:`~kgsynth.train.core` what both share: recipes, field checks, precision, the DeepSpeed
  config and its one-process environment, the stored system prompt;
- SFT: :mod:`~kgsynth.train.sft_config` (options, recipes, checks), :mod:`~kgsynth.train.data`
  (corpus -> rendered, masked, packed rows), :mod:`~kgsynth.train.sft_run` (the run folder),
  :mod:`~kgsynth.train.sft_trainer` (transformers' Trainer and its additions),
  :mod:`~kgsynth.train.sft_setup` (processes, precision, the model and the trainer),
  :mod:`~kgsynth.train.sft` (the training run), with :mod:`~kgsynth.train.drills` and
  :mod:`~kgsynth.train.probe` (name copying), and :mod:`~kgsynth.train.tiny` (the tiny CPU
  model built from a config with a locally trained tokenizer);
- GRPO: :mod:`~kgsynth.train.grpo_config`, :mod:`~kgsynth.train.grpo_loss` (advantages, loss),
  :mod:`~kgsynth.train.grpo_update`, :mod:`~kgsynth.train.grpo_step` (one step),
  :mod:`~kgsynth.train.grpo_tree` (one step on tree rollouts: step-level GRPO),
  :mod:`~kgsynth.train.grpo_dist` (policy and collectives), :mod:`~kgsynth.train.grpo_run`
  (spec, questions, files), :mod:`~kgsynth.train.grpo_resume` (checkpoints, resuming),
  :mod:`~kgsynth.train.grpo` (the loop), with :mod:`~kgsynth.train.presets`;
- :mod:`~kgsynth.train.launch` (multi-process launch and the worker entry point),
  :mod:`~kgsynth.train.stages` (the stages as ``kgsynth train`` runs them),
  :mod:`~kgsynth.train.lora`, :mod:`~kgsynth.train.plots`.
"""
