"""Recovery trajectories from a policy's own failed rollouts: a stage-2 corpus without an expert.

GraphWalker's stage 2 (GraphRoll, §2.2.2) teaches "reflection and error recovery" from an
expert LLM's trajectories. Without an expert, the errors can be the policy's own: for each
failed free rollout of a question with an oracle replay, find the first tool call where the
rollout leaves the replay; where that call failed (a tool or format error) or followed another
relation than the replay's (``--kinds``), the recovery is the replay's steps up to there, the
policy's wrong call and its observation (kept as context: ``"train": False``, so the loss
does not teach the mistake), then the replay's remaining calls, re-run through the tools after
the wrong one, and its answer. A recovery whose later observations differ from the replay's
(the tools' episode state moved) is left out, and so is a repeat of one (question, step, wrong
call). This is DAgger's labelling (Ross et al. 2011): the states the policy reaches by its
own mistakes, with the oracle's next actions.

    .venv/bin/python benchmarks/recoveries.py --run RUN --rollouts FREE.parquet \\
        --out recoveries.parquet [--kinds error,relation] [--base RUN/corpus_stage2/accepted.parquet]

``RUN`` is a ``kgsynth run`` folder (its ``questions``, ``kg`` and the held-out oracle replays
``stage2_data/oracle.parquet``); ``FREE.parquet`` the policy's free rollouts of those
questions. With ``--base`` the output holds that corpus's rows first, then the recoveries: a
corpus for ``kgsynth train stage2 --corpus``. Prints the counts of each outcome.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RECIPE = Path(__file__).resolve().parents[1] / "kgsynth/resources/recipes/metaqa_default.yaml"
KINDS = ("error", "relation", "entity", "other")


def calls_of(messages: Sequence[dict[str, Any]]) -> tuple[list[str], list[str | None]]:
    """The assistant turns of a conversation and the tool call of each (None: no call)."""
    from kgsynth.agent.protocol import QUERY_RE

    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    calls = []
    for t in turns:
        m = QUERY_RE.search(t)
        calls.append(m.group(1).strip() if m else None)
    return turns, calls


def first_divergence(policy: Sequence[str | None], oracle: Sequence[str | None]) -> int | None:
    """The first turn where the policy's call differs from the replay's, when both made a call
    there; None otherwise (the rollout went wrong only in its answer, or answered early)."""
    t = 0
    while t < min(len(policy), len(oracle)) and policy[t] == oracle[t] and policy[t] is not None:
        t += 1
    if t >= len(policy) or t >= len(oracle) or policy[t] is None or oracle[t] is None:
        return None
    return t


def divergence_kind(policy_call: str, oracle_call: str, turn: dict[str, Any] | None) -> str:
    """``error`` (the call failed), ``relation`` (both follow a relation, not the same one),
    ``entity`` (both list relations, of other entities) or ``other``."""
    if turn and (turn.get("tool_error") or turn.get("format_error")):
        return "error"
    tool = policy_call.split("(", 1)[0].strip()
    if tool != oracle_call.split("(", 1)[0].strip():
        return "other"
    return {"get_triples": "relation", "get_relations": "entity"}.get(tool, "other")


Turns = tuple[list[str], list[str | None]]
"""A conversation's assistant turns and their calls (:func:`calls_of`)."""


def recovery(env: Any, policy: Turns, oracle: Turns, replay: dict[str, Any], t: int) -> list | None:
    """The recovery messages (module docstring) from the policy's and the replay's turns
    (``replay`` the oracle row), or None where the replay's observations after the wrong call
    are not the ones it saw."""
    from kgsynth.agent.protocol import render_observation

    p_turns, p_calls = policy
    o_turns, o_calls = oracle
    o_obs = [m["content"] for m in replay["messages"] if m["role"] == "tool"]
    messages = [dict(m) for m in replay["messages"][:2]]
    for k in range(t):
        env.execute(o_calls[k])
        messages += [
            {"role": "assistant", "content": o_turns[k]},
            {"role": "tool", "content": o_obs[k]},
        ]
    wrong = env.execute(p_calls[t])
    messages += [
        {"role": "assistant", "content": p_turns[t], "train": False},
        {"role": "tool", "content": render_observation(wrong.text)},
    ]
    for k in range(t, len(o_calls) - 1):
        seen = render_observation(env.execute(o_calls[k]).text)
        if seen != o_obs[k]:
            return None
        messages += [
            {"role": "assistant", "content": o_turns[k]},
            {"role": "tool", "content": seen},
        ]
    messages.append({"role": "assistant", "content": o_turns[-1]})
    return messages


def build(
    run: Path, rollouts: list[dict[str, Any]], kinds: set[str], kg: str | None = None
) -> tuple[list[list[dict[str, Any]]], Counter[str]]:
    """The recoveries of ``rollouts`` (failed ones: predicted answers not the gold set) and the
    count of every outcome."""
    import pyarrow.parquet as pq

    from kgsynth.agent.strategies.round_trips import with_round_trip_words
    from kgsynth.agent.tools import ToolEnvironment, prime_relation_ranking
    from kgsynth.agent.topics import in_mention_order
    from kgsynth.cli.common import open_graph_option
    from kgsynth.core.config import build_config
    from kgsynth.synthesize.trajectory_config import TrajectoryConfig

    questions = pq.read_table(run / "questions" / "questions.parquet").to_pylist()
    cfg = build_config(TrajectoryConfig, RECIPE, {}, section="heldout_oracle")
    cfg = with_round_trip_words(cfg, questions)
    prime_relation_ranking(cfg.tool_config(), (q["question"] for q in questions))
    graph = open_graph_option(kg or str(run / "kg"), None)
    by_id = {q["question_id"]: q for q in questions}
    oracle_rows = pq.read_table(run / "stage2_data" / "oracle.parquet").to_pylist()
    replays = {r["question_id"]: r for r in oracle_rows}
    tally: Counter[str] = Counter()
    seen: set[tuple[str, int, str]] = set()
    out = []
    for r in rollouts:
        if set(r["predicted_answers"]) == set(r["gold_answers"]):
            tally["succeeded"] += 1
            continue
        replay = replays.get(r["question_id"])
        if replay is None:
            tally["no replay"] += 1
            continue
        policy, oracle = calls_of(r["messages"]), calls_of(replay["messages"])
        p_calls, o_calls = policy[1], oracle[1]
        t = first_divergence(p_calls, o_calls)
        if t is None:
            tally["no wrong call"] += 1
            continue
        turns = r.get("turns") or []
        kind = divergence_kind(p_calls[t], o_calls[t], turns[t] if t < len(turns) else None)  # type: ignore[arg-type]
        tally[f"wrong {kind}"] += 1
        key = (r["question_id"], t, p_calls[t] or "")
        if kind not in kinds or key in seen:
            tally["left out: kind" if kind not in kinds else "left out: repeat"] += 1
            continue
        seen.add(key)
        q = in_mention_order(by_id[r["question_id"]])
        env = ToolEnvironment(
            graph, q["question"], cfg.tool_config(), topics=list(q["topic_names"])
        )
        messages = recovery(env, policy, oracle, replay, t)
        if messages is None:
            tally["left out: observations moved"] += 1
            continue
        tally["recoveries"] += 1
        out.append(messages)
    return out, tally


def write_corpus(path: Path, conversations: list[list[dict[str, Any]]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    msg = pa.struct([("role", pa.string()), ("content", pa.string()), ("train", pa.bool_())])
    rows = [
        [{"role": m["role"], "content": m["content"], "train": m.get("train")} for m in conv]
        for conv in conversations
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"messages": pa.array(rows, type=pa.list_(msg))}), path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a kgsynth run folder")
    ap.add_argument("--rollouts", type=Path, required=True, help="the policy's free rollouts")
    ap.add_argument("--out", type=Path, required=True, help="the corpus to write (Parquet)")
    ap.add_argument("--kinds", default="error,relation", help=f"of {', '.join(KINDS)}")
    ap.add_argument("--base", type=Path, default=None, help="a corpus to put first")
    ap.add_argument("--kg", default=None, help="the KG (default: RUN/kg)")
    args = ap.parse_args(argv)
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    if not kinds <= set(KINDS):
        ap.error(f"--kinds: {sorted(kinds - set(KINDS))} not among {', '.join(KINDS)}")

    import pyarrow.parquet as pq

    from kgsynth.train.data import read_corpus

    rollouts = pq.read_table(args.rollouts).to_pylist()
    recoveries, tally = build(args.run, rollouts, kinds, args.kg)
    base = read_corpus(args.base) if args.base else []
    write_corpus(args.out, [*base, *recoveries])
    print(", ".join(f"{k} {v:,}" for k, v in sorted(tally.items())))
    print(f"{len(recoveries):,} recoveries + {len(base):,} base rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
