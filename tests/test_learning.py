"""A short SFT run learns to copy names it has never seen (issue 12), and the probe that says so.

The fixture: agent trajectories over made-up entity names (a new name per trajectory, so no name
is memorisable), in the agent protocol with the short system prompt. The tiny recipe of
the packaged ``metaqa_default`` recipe (a copy warm-up on drills of the corpus's names, then the
trajectories) trains a few hundred steps; the copy probe, measured on
trajectories held out of the optimisation, must fall well below where it started — the policy
predicts the names it copies from its context into its tool calls and answers, not only the
protocol around them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from kgsynth.agent.loop import system_prompt, user_prompt
from kgsynth.core.errors import ConfigError
from kgsynth.core.schema import TRAJECTORY_SCHEMA
from kgsynth.resources import resource
from kgsynth.train.probe import copy_char_spans, copy_loss, copy_targets
from kgsynth.train.sft import PROBE_ROWS, SFTConfig, prepare_run, train_sft
from kgsynth.train.tiny import build_tiny_model

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "do", "fa", "gu", "ha", "jo"]
RELATIONS = ["directed_by", "starred_actors", "has_genre", "written_by"]


def _name(rng: random.Random) -> str:
    words = [
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))).capitalize()
        for _ in range(rng.randint(1, 3))
    ]
    return " ".join(words)


def trajectory(rng: random.Random) -> list[dict[str, str]]:
    topic, rel = _name(rng), rng.choice(RELATIONS)
    answers = [_name(rng) for _ in range(rng.randint(1, 3))]
    shown = "\n".join(f"({topic}, {r}, ?)" for r in RELATIONS)
    facts = "\n".join(f"({topic}, {rel}, {a})" for a in answers)
    return [
        {"role": "system", "content": system_prompt(style="short")},
        {"role": "user", "content": user_prompt(f"What is the {rel} of {topic}?", [topic])},
        {
            "role": "assistant",
            "content": f"<think>I list the relations of {topic}.</think>\n"
            f"<kg-query>get_relations({json.dumps(topic)})</kg-query>",
        },
        {"role": "tool", "content": f'<information>Relations of "{topic}":\n{shown}</information>'},
        {
            "role": "assistant",
            "content": f"<think>I follow {rel} from {topic}.</think>\n"
            f"<kg-query>get_triples({json.dumps(topic)}, [{json.dumps(rel)}])</kg-query>",
        },
        {"role": "tool", "content": f"<information>{facts}</information>"},
        {
            "role": "assistant",
            "content": "<think>The facts I found answer the question.</think>\n"
            f"<answer>{json.dumps(answers)}</answer>",
        },
    ]


def write_corpus(path: Path, conversations: list[list[dict[str, str]]]) -> Path:
    rows = []
    for i, messages in enumerate(conversations):
        rows.append({f.name: None for f in TRAJECTORY_SCHEMA} | {
            "trajectory_id": f"t{i}", "question_id": f"q{i}", "mode": "oracle", "sample": 0,
            "question": messages[1]["content"], "messages": messages, "answered": True,
        })  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), path)
    return path


def test_copy_spans_are_the_quoted_names_read_before():
    conv = trajectory(random.Random(3))
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (tokenizer built below)

    tok_dir = build_tiny_model([m["content"] for m in conv], Path("/tmp") / "kgs-probe-tok")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    from kgsynth.agent.render import assistant_spans

    text, spans = assistant_spans(tok, conv)
    copied = [text[a:b] for a, b in copy_char_spans(text, spans)]
    topic = conv[1]["content"].split("Topic entities: ")[1]
    answers = json.loads(conv[-1]["content"].split("<answer>")[1].split("</answer>")[0])
    # the topic in both calls, the relation in get_triples, every answer
    assert copied.count(topic) == 2 and answers == copied[-len(answers) :]
    ids, mask = copy_targets(tok, conv)
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
    # a made-up answer that was never shown is not a copy target
    conv[-1]["content"] = '<answer>["Nowhere Seen"]</answer>'
    text, spans = assistant_spans(tok, conv)
    assert "Nowhere Seen" not in [text[a:b] for a, b in copy_char_spans(text, spans)]


def test_a_short_run_learns_to_copy_unseen_names(tmp_path):
    rng = random.Random(0)
    corpus = write_corpus(tmp_path / "corpus.parquet", [trajectory(rng) for _ in range(800)])
    recipe = yaml.safe_load(resource("recipes", "metaqa_default.yaml").read_text())["stage1"]
    cfg = SFTConfig(
        model="tiny",
        max_steps=400,
        copy_warmup_steps=300,
        lr=recipe["lr"],
        batch_size=recipe["batch_size"],
        micro_batch_size=recipe["micro_batch_size"],
        tiny_hidden_size=recipe["tiny_hidden_size"],
        tiny_layers=recipe["tiny_layers"],
        tiny_heads=recipe["tiny_heads"],
        tiny_init_std=recipe["tiny_init_std"],
        tiny_vocab_size=400,
        logging_steps=50,
        save_steps=1000,
        warmup_ratio=0.02,
    )
    spec = prepare_run(cfg, "stage1", corpus, tmp_path / "s1", overwrite=True)
    summary = train_sft(spec)
    probe = summary["copy_probe"]
    assert probe["trajectories"] == PROBE_ROWS
    assert summary["copy_warmup"]["steps"] == 300 and summary["copy_warmup"]["drills"] > 0
    start, end = probe["loss_start"], probe["loss_end"]
    # at random init a copied token costs about ln(vocabulary) nats; after the run, on names it
    # never trained on, well under half of that
    assert start > 5.0
    assert end < 0.45 * start, probe
    # the stored system prompt is the corpus's (short) one
    stored = (tmp_path / "s1" / "agent_system_prompt.txt").read_text()
    assert stored == system_prompt(style="short")
    # Copying, not name statistics: on fresh trajectories the names the policy must write cost
    # far less when they are in its context than the same kind of names when they are not
    # (the control: the actions' names swapped for fresh ones). A model that had learnt only
    # what names look like would score both alike.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "s1")
    tok = AutoTokenizer.from_pretrained(tmp_path / "s1")
    fresh = [trajectory(random.Random(99 + i)) for i in range(24)]
    control = [_swap_action_names(c, random.Random(7 + i)) for i, c in enumerate(fresh)]
    seen = copy_loss(model, tok, fresh)
    unseen = copy_loss(model, tok, control, seen_only=False)
    print("copy loss in context", seen, "not in context", unseen)
    assert seen < 0.6 * unseen, (seen, unseen)


def _swap_action_names(conv: list[dict[str, str]], rng: random.Random) -> list[dict[str, str]]:
    """The conversation with every name in the assistant's actions replaced by a fresh one."""
    topic = conv[1]["content"].split("Topic entities: ")[1]
    answers = json.loads(conv[-1]["content"].split("<answer>")[1].split("</answer>")[0])
    swap = {n: _name(rng) for n in [topic, *answers]}
    out = []
    for m in conv:
        content = m["content"]
        if m["role"] == "assistant":
            for old, new in swap.items():
                content = content.replace(f'"{old}"', f'"{new}"')
        out.append({**m, "content": content})
    return out


def test_drills_copy_the_names_of_query_result_rows_and_skip_when_there_are_none():
    from kgsynth.train.drills import copy_drills

    def conv(observation: str) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": "Question: who directed Kismet"},
            {"role": "assistant", "content": '<kg-query>sparql("SELECT ?d WHERE {}")</kg-query>'},
            {"role": "tool", "content": f"<information>{observation}</information>"},
        ]

    rows = "?film\t?director\nKismet\tWilliam Dieterle\nJuarez\tWilliam Dieterle\n[... more rows]"
    drills = copy_drills([conv(rows)], 6, seed=0)
    shown = {m["content"] for d in drills for m in d if m["role"] == "assistant"}
    assert len(drills) == 6 and any("William Dieterle" in s for s in shown)
    assert not any("?film" in s or "more rows" in s for s in shown)
    assert copy_drills([conv("no rows")], 6, seed=0) == []


def test_a_copy_warm_up_that_misses_its_target_starts_again_from_the_initial_weights(tmp_path):
    """--copy-warmup-target: a warm-up whose drill loss stays above the target is undone and run
    again on another seed's drills, from the same initial weights (so the second try is
    exactly a first try with that seed); a reachable target stops after the first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.drills import copy_drills, warm_up
    from kgsynth.train.sft import _copy_warm_up

    rng = random.Random(0)
    train = [trajectory(rng) for _ in range(40)]
    folder = build_tiny_model(
        [m["content"] for c in train for m in c], tmp_path / "tiny", vocab_size=300, seed=0
    )
    tok = AutoTokenizer.from_pretrained(folder)

    def run(**options):
        model = AutoModelForCausalLM.from_pretrained(folder)
        cfg = SFTConfig(model="tiny", copy_warmup_steps=6, copy_warmup_batch_size=4, **options)
        return model, _copy_warm_up(model, tok, {"train": train}, cfg)

    missed, stats = run(copy_warmup_target=1e-9, copy_warmup_tries=2)
    assert stats["tries"] == 2 and len(stats["loss_last_tenth_per_try"]) == 2
    second = AutoModelForCausalLM.from_pretrained(folder)
    warm_up(second, tok, copy_drills(train, 24, 1), steps=6, batch_size=4, seed=1)
    for (name, a), b in zip(missed.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    _, reached = run(copy_warmup_target=100.0, copy_warmup_tries=3)
    assert reached["tries"] == 1
    _, plain = run()
    assert (
        plain["tries"] == 1
        and plain["loss_last_tenth_per_try"] == reached["loss_last_tenth_per_try"]
    )


def test_a_copy_warm_up_above_its_target_drills_on_up_to_its_step_limit(tmp_path):
    """--copy-warmup-max-steps: a warm-up still above the target after its steps goes on, in
    tenths of its steps, to the limit (an unreachable target) or stops at the first check at
    the target; without a target it runs its steps exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.drills import copy_drills, warm_up

    rng = random.Random(0)
    train = [trajectory(rng) for _ in range(40)]
    folder = build_tiny_model(
        [m["content"] for c in train for m in c], tmp_path / "tiny", vocab_size=300, seed=0
    )
    tok = AutoTokenizer.from_pretrained(folder)
    drills = copy_drills(train, 40, 0)

    def run(**options):
        model = AutoModelForCausalLM.from_pretrained(folder)
        return warm_up(model, tok, drills, steps=10, batch_size=4, **options)

    assert run(target=1e-9, max_steps=25)["steps"] == 25
    assert run(target=100.0, max_steps=25)["steps"] == 10
    assert run(max_steps=25)["steps"] == 10
    with pytest.raises(ConfigError, match="copy_warmup_max_steps"):
        SFTConfig(model="tiny", copy_warmup_steps=10, copy_warmup_max_steps=5)


def _warm_up_steps(folder: str) -> dict:
    """The losses, summary and final weights of 8 warm-up steps on the fixture's drills, from
    the model in ``folder`` (in a process group, this process's share of them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.drills import copy_drills, warm_up

    rng = random.Random(0)
    train = [trajectory(rng) for _ in range(40)]
    model = AutoModelForCausalLM.from_pretrained(folder)
    losses: list[float] = []
    stats = warm_up(
        model, AutoTokenizer.from_pretrained(folder), copy_drills(train, 40, 0), steps=8,
        batch_size=6, progress=lambda _step, loss: losses.append(loss),
    )  # fmt: skip
    return {
        "losses": losses,
        "stats": stats,
        "params": [p.detach().clone() for p in model.parameters()],
    }


def _warm_up_rank(rank: int, world: int, port: int, folder: str, out: str) -> None:
    import os

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(_warm_up_steps(folder), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_copy_warm_up_on_two_processes_takes_the_one_process_steps(tmp_path):
    """Launched on N processes (`--nproc-per-node`), the warm-up splits each batch between
    them and sums the gradients: the same losses and weights as one process (float rounding
    apart), and every process ends with the same weights."""
    import torch
    import torch.multiprocessing as mp

    from kgsynth.train.core import free_port

    rng = random.Random(0)
    train = [trajectory(rng) for _ in range(40)]
    folder = build_tiny_model(
        [m["content"] for c in train for m in c], tmp_path / "tiny", vocab_size=300, seed=0
    )
    one = _warm_up_steps(str(folder))
    losses = one["losses"]
    mp.spawn(_warm_up_rank, args=(2, free_port(), str(folder), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in ranks:
        assert r["losses"] == pytest.approx(losses, abs=1e-5)
        assert r["stats"]["tokens"] == one["stats"]["tokens"]
        for a, b in zip(r["params"], one["params"], strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=0)
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert torch.equal(a, b)
    assert losses[-1] < losses[0]  # the steps moved the weights
