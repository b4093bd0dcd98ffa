"""``kgsynth eval``: benchmark questions + a policy + a KG -> predictions and metrics.

The policy (a local checkpoint through the ``hf`` backend, or a model behind an
OpenAI-compatible API) answers every question as a KG agent — the same loop, tools, limits and
system prompt as trajectory synthesis and RL (:func:`kgsynth.agent.loop.run_episodes`) —
``runs`` times (run ``r`` samples with seed ``seed + r``). Each prediction is scored with the
shared answer metrics (:mod:`kgsynth.metrics`: ``em_strict``, ``hit``, set ``f1``,
``hits_at_1``, ``rhits_at_1``, precision and recall, each defined there) and the runs are
aggregated (:func:`summarize`):

- ``overall``: the mean over every (question, run) prediction; ``per_run`` one entry per run,
  ``std_over_runs`` the spread of the per-run means;
- ``ci95``: a 95 % confidence interval ``[lo, hi]`` of each overall shown metric (and the
  same inside each ``breakdowns["hops"]`` group), with the question as the unit: the Wilson
  score interval when every question scores 0 or 1 (one run of a binary metric, or runs that
  agree), else a percentile bootstrap resampling questions (each with all its runs; 2,000
  resamples, seed 0) — see :func:`kgsynth.metrics.mean_interval`; ``ci95_method`` says so;
- ``first_run``: run 0 alone;
- ``majority``: per question, the most frequent normalized answer set among the runs (runs
  without an answer do not vote; a tie goes to the set that appears first, in run order);
- ``union``: per question, the union of all runs' answers — what KG-R1 reports as its
  "N runs" result; labelled ``KG-R1 N runs (union)``, never as a score of one run. The union
  has no first answer, so its ``hits_at_1`` is KG-R1's N-run Hits@1: some answer of some run
  is gold (union ["X", "A"] against gold {A, B} scores 1);
- ``pass_at_k``: the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` from ``n`` runs of which
  ``c`` are correct by ``hit`` (``pass_at_k_metric``), averaged over questions, for
  k = 1, 2, 4, … ≤ n and k = n;
- ``breakdowns`` by ``hops``, ``qtype`` and ``structure`` (those the questions carry);
- ``process``: assistant turns, tool errors, format errors, LLM errors and generated tokens
  (the backend's completion-token counts) per prediction, and answered / forced-answer rates.

Baselines use the same scoring: another model as the agent (``--baseline untrained``, the model a
checkpoint was trained from, found through the ``start_from`` chain of the training
manifests), or the evaluated model answering from its own knowledge with no tools
(``no-tools``: one generation per question and run). :func:`compare_runs` puts several
``metrics.json`` side by side (``kgsynth eval --compare``).

Usage::

    records = read_questions("data/metaqa/dev_sample/metaqa_dev_sample.jsonl")
    rows, metrics = evaluate(records, make_llm("hf", model="runs/x/stage1"), KGGraph(kg), EvalConfig(runs=3, temperature=1.0))
"""

from __future__ import annotations

import importlib
from typing import Any

# Each public name and the module that defines it. The package loads a module when one of its
# names is first used: the CLI reads EvalConfig on every start, and the agent, KG and plotting
# layers load only when an evaluation runs.
_MODULES = {
    "checkpoints": ("checkpoint_label", "untrained_model"),
    "compare": (
        "ci_cell",
        "compare_markdown",
        "compare_runs",
        "find_metrics",
        "fmt_value",
        "hop_columns",
        "load_metrics",
        "run_compare",
    ),
    "config": (
        "BASELINES",
        "METRICS",
        "METRIC_LEGEND",
        "METRIC_NAMES",
        "SHOWN_METRICS",
        "UNION_LABEL",
        "EvalConfig",
        "check_records",
        "load_questions",
    ),
    "episodes": ("run_agent", "run_no_tools"),
    "figures": ("compare_png", "eval_png"),
    "scoring": ("majority_choice", "pass_at_k", "pass_ks", "summarize", "union_answers"),
    "subjects": ("Subject", "evaluate", "plan_subjects", "run"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
_HOME["PREDICTION_SCHEMA"] = "kgsynth.schema"


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(home if "." in home else f"{__name__}.{home}")
    return getattr(module, name)


__all__ = sorted(_HOME)
