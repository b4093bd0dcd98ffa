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

    from kgsynth.eval.subjects import evaluate

    records = read_questions(kgsynth.resources.dev_sample())
    rows, metrics = evaluate(records, make_llm("hf", model="runs/x/stage1"), KGGraph(kg), EvalConfig(runs=3, temperature=1.0))

Modules: ``config`` (``EvalConfig``, the metric names, question loading), ``subjects``
(``evaluate``, ``run``), ``episodes`` (the agent and no-tools runs), ``scoring``
(``summarize`` and the run aggregates), ``compare`` (``compare_runs``), ``figures``,
``checkpoints``. The package imports none of them, so the CLI's start loads only what it uses.
"""
