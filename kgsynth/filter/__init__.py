"""``kgsynth filter``: trajectories.parquet -> an SFT corpus of accepted trajectories.

Input: rows in :data:`kgsynth.core.schema.TRAJECTORY_SCHEMA` (``kgsynth synthesize trajectories``).
Output: the accepted rows and the rejected rows, each with a ``reject_reason`` (the first
filter it failed), plus counts. Every input row ends up in exactly one of the two::

    kgsynth filter --in runs/x/trajectories.parquet --out runs/x/corpus
    kgsynth filter --in t.parquet --out corpus --outcome em_strict --balance structure --benchmark qa_dev.txt

    from kgsynth.filter import FilterConfig, run, run_filters
    result = run(table, FilterConfig(max_per_question=2))  # the stage contract: a StageResult
    accepted, rejected, stats = run_filters(table, FilterConfig(max_per_question=2))

Filters, in this fixed order; a row that fails one is not looked at by the later ones. The
filters of single rows (1-7) come first, then those over groups of rows (8-10), so a group's
slots (the first of a repeated action sequence, the per-question cap, balancing) only go to rows
that pass every row filter; that is why length and contamination run before the duplicate and
cap filters:

1. ``no_answer`` — the predicted answer set is empty after normalization (no ``<answer>``, an
   empty list, or only blank/punctuation answers). Checked when ``outcome`` is not ``none`` or
   ``grounding`` is on.
2. ``wrong_answer`` (``outcome``, a metric of :mod:`kgsynth.metrics`) — ``em_strict``: the
   predicted set must equal the gold set; ``hit``: some predicted answer must be gold
   (KnowCoder-A1's rejection rule, "at least one answer is gold"); ``f1``: ``em_strict`` = 1 or
   F1 >= ``f1_threshold`` (0.9); ``f1_above``: F1 > ``f1_threshold`` (KBQA-R1 Table VII's
   "F1 > 0.9"); ``none``: off. Plain ``em`` is refused as ambiguous.
   All are set metrics over :func:`~kgsynth.metrics.normalize_answer` keys.
3. ``ungrounded_answer`` (``grounding``) — every predicted answer, normalized, must be the
   normalized form of a name in ``observed_entities``: names the environment returned (KnowCoder-A1,
   GraphWalker). Message text is never read here, so an ``<information>`` block the model
   wrote itself cannot ground an answer.
4. ``bad_format`` (``check_format``) — every assistant message parses with
   :func:`~kgsynth.agent.protocol.parse_turn` without a ``format_error`` (a ``<think>`` block
   and exactly one action), and the last assistant message is an ``<answer>`` that parses;
   or, every turn alike, in another action space's turn format (isp's ``<node>``/``<SPARQL>``
   operations and ``\\boxed{}`` answers; the sexpr space's ``<action>`` blocks and
   space-separated answers; :func:`~kgsynth.filter.checks.turn_formats`).
   A trajectory without assistant messages fails.
5. ``reference_leak`` (``reference_leak``; rows with ``mode == "referenced"`` and a non-blank
   ``reference`` only) — the stripped reference, or any of its lines that is at least
   ``leak_min_chars`` (12) characters long once stripped, occurs in some message's content.
   The reference the synthesizer writes numbers its lines (``1. get_relations("X")``), so the
   model's own ``<kg-query>get_relations("X")</kg-query>`` is no leak, but copied hint text is.
6. ``too_long`` — the messages' contents add up to more than ``max_chars`` characters (16,000)
   or ``num_turns`` is above ``max_turns`` (off by default).
7. ``contamination`` (only when ``run_filters`` is given ``max_similarity``; the CLI builds it
   from ``--benchmark`` files with :class:`~kgsynth.datasets.contamination.ContaminationGuard`) —
   the row's ``question`` is at or above ``contamination_threshold`` (0.85) cosine similarity
   to a benchmark question. Each distinct question of the rows still kept is embedded once.
8. ``duplicate_actions`` (``dedup_actions``) — same ``question_id`` and the same ``tool_calls``
   sequence (each call with whitespace runs collapsed to one space and the ends stripped) as
   an earlier row still kept; the first one in input order stays.
9. ``over_question_cap`` (``max_per_question``, 3, KnowCoder-A1) — rows of a question beyond
   its first ``max_per_question`` still kept, in input order.
10. ``balance`` — first ``max_per_structure``: at most that many rows per ``structure``; then
    ``balance`` (``structure`` or ``hops``): every group is capped at
    ``floor(balance_factor * size of the smallest group)`` (``balance_factor`` >= 1, default
    2; 1 makes all groups as small as the smallest). A null structure/hops is a group of its
    own. Within a group the rows kept are those of questions with the fewest rows kept before
    them (each question's 1st row, then 2nd rows, ...), ties in input order, so a capped group
    keeps as many different questions as it can. Then, with ``upsample_factor`` > 1
    (KnowCoder-A1's upsampling of rare types), every ``balance`` group smaller than the largest
    grows to ``min(largest, floor(upsample_factor * its size))`` rows with copies of its
    accepted rows (whole copies in input order, then a draw seeded by ``seed``), appended after
    the accepted rows with ``~copyN`` ids; the manifest's ``balance.upsample`` and
    ``upsampled_rows`` record them.

Both outputs carry the input columns (:data:`~kgsynth.core.schema.TRAJECTORY_SCHEMA`, extra input
columns dropped) then ``em`` and ``f1`` (float64, computed for every row); in the rejected
rows ``reject_reason`` comes between the two (:data:`ACCEPTED_SCHEMA`, :data:`REJECTED_SCHEMA`).
``stats`` holds the counts per enabled reason in filter order, acceptance by structure, hops,
mode and turns, the contamination report, the balancing caps and the seconds of each step.

Speed: the filters run as column operations (Arrow compute, polars, numpy) over the whole
table. Per-row Python is left where nothing else will do, and kept small: each distinct answer
or entity string is normalized once (:func:`~kgsynth.metrics.normalize_answer`, dictionary
cache), assistant messages are matched against two regular expressions that accept only turns
``parse_turn`` also accepts and only the rows that miss them are parsed one by one, and the
reference-leak substring checks run only on ``referenced`` rows still kept.

Modules: :mod:`~kgsynth.filter.config` (options and reasons), :mod:`~kgsynth.filter.columns`
(the input table and vectorised helpers), :mod:`~kgsynth.filter.checks` (answer, format and
leak checks), :mod:`~kgsynth.filter.base` (a filter: a reason and the rows it rejects; the run
state each one reads), :mod:`~kgsynth.filter.filters` (one class per filter, their order, and
:func:`run_filters`), :mod:`~kgsynth.filter.outputs` (the accepted and rejected tables,
upsampling, the stats), :mod:`~kgsynth.filter.figure` (``filter_stats.png``) and
:mod:`~kgsynth.filter.corpus` (the stage: reading the ``--in`` files, :func:`run`, writing the
corpus folder).
"""

from kgsynth.core.schema import ACCEPTED_SCHEMA, REJECTED_SCHEMA
from kgsynth.filter.checks import (
    FAST_ANSWER_TURN,
    FAST_QUERY_TURN,
    answer_checks,
    format_checks,
    leak_checks,
    normalized_ids,
)
from kgsynth.filter.columns import as_trajectory_table, missing_columns
from kgsynth.filter.config import BALANCE_BY, OUTCOMES, REASONS, FilterConfig, MaxSimilarity
from kgsynth.filter.corpus import CORPUS_FILES, CorpusInputs, read_inputs, run, write_corpus
from kgsynth.filter.figure import filter_stats_png
from kgsynth.filter.filters import run_filters

__all__ = [
    "ACCEPTED_SCHEMA",
    "BALANCE_BY",
    "CORPUS_FILES",
    "FAST_ANSWER_TURN",
    "FAST_QUERY_TURN",
    "OUTCOMES",
    "REASONS",
    "REJECTED_SCHEMA",
    "CorpusInputs",
    "FilterConfig",
    "MaxSimilarity",
    "answer_checks",
    "as_trajectory_table",
    "filter_stats_png",
    "format_checks",
    "leak_checks",
    "missing_columns",
    "normalized_ids",
    "read_inputs",
    "run",
    "run_filters",
    "write_corpus",
]
