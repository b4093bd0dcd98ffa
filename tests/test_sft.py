"""SFT (kgsynth train stage1/stage2) on a tiny corpus and a tiny model, on CPU.

The loss mask (masked tokens contribute nothing, packed samples never see each other), the
loss going down, resume continuing the same run, the saved folder reloading and generating,
DeepSpeed ZeRO-2/3 in one CPU process, stage 2 starting from stage 1's weights, and the
launch commands and errors of the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.loop import system_prompt, user_prompt
from kgsynth.cli.train import train_app
from kgsynth.core.schema import TRAJECTORY_SCHEMA
from kgsynth.train.data import (
    IGNORE_INDEX,
    Collator,
    PackedRow,
    Sample,
    build_samples,
    corpus_texts,
    pack_samples,
    row_features,
    to_sample,
)
from kgsynth.train.sft import SFTConfig, prepare_run, read_metrics, train_sft

runner = CliRunner()

MOVIES = [
    ("Kismet", "William Dieterle", ["Marlene Dietrich", "Ronald Colman"], "1944"),
    ("The Matrix", "Lana Wachowski", ["Keanu Reeves", "Carrie-Anne Moss"], "1999"),
    ("Amélie", "Jean-Pierre Jeunet", ["Audrey Tautou", "Mathieu Kassovitz"], "2001"),
    ("Heat", "Michael Mann", ["Al Pacino", "Robert De Niro", "Val Kilmer"], "1995"),
    ("Alien", "Ridley Scott", ["Sigourney Weaver", "Tom Skerritt"], "1979"),
    ("Paprika", "Satoshi Kon", ["Megumi Hayashibara"], "2006"),
    ("Fargo", "Joel Coen", ["Frances McDormand", "William H. Macy"], "1996"),
    ("Ran", "Akira Kurosawa", ["Tatsuya Nakadai"], "1985"),
]
ASKS = [
    ("directed_by", "Who directed {m}?", lambda d, a, y: [d]),
    ("starred_actors", "Which actors starred in {m}?", lambda d, a, y: a),
    ("release_year", "When was {m} released?", lambda d, a, y: [y]),
]


def trajectory(movie: str, director: str, actors: list[str], year: str, ask) -> list[dict]:
    relation, question, answer = ask
    values = {"directed_by": [director], "starred_actors": actors, "release_year": [year]}
    facts = "\n".join(f"({movie}, {relation}, {v})" for v in values[relation])
    return [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": user_prompt(question.format(m=movie), [movie])},
        {
            "role": "assistant",
            "content": f"<think>I list the relations of {movie}.</think>\n"
            f'<kg-query>get_relations("{movie}")</kg-query>',
        },
        {
            "role": "tool",
            "content": f'<information>Relations of "{movie}":\n({movie}, directed_by, ?)\n'
            f"({movie}, starred_actors, ?)\n({movie}, release_year, ?)</information>",
        },
        {
            "role": "assistant",
            "content": f"<think>The relation {relation} answers it.</think>\n"
            f'<kg-query>get_triples("{movie}", ["{relation}"])</kg-query>',
        },
        {"role": "tool", "content": f"<information>{facts}</information>"},
        {
            "role": "assistant",
            "content": "<think>The facts answer the question.</think>\n"
            f"<answer>{json.dumps(answer(director, actors, year), ensure_ascii=False)}</answer>",
        },
    ]


CONVERSATIONS = [trajectory(*movie, ask) for movie in MOVIES for ask in ASKS]  # 24


def write_corpus(path: Path, conversations=CONVERSATIONS) -> Path:
    rows = [
        {"trajectory_id": f"t{i}", "mode": "oracle", "messages": conv}
        for i, conv in enumerate(conversations)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), path)
    return path


# Small enough for a few seconds per run: rows of 512 tokens, 4 rows a step.
FAST = dict(max_length=512, batch_size=4, micro_batch_size=2, logging_steps=1, warmup_ratio=0.0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "accepted.parquet")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from kgsynth.train.tiny import build_tiny_model

    return build_tiny_model(
        corpus_texts(CONVERSATIONS), tmp_path_factory.mktemp("tiny") / "m", vocab_size=600
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def stage1(corpus, tmp_path_factory) -> Path:
    """A stage-1 run through the CLI: the tiny model, 24 steps."""
    out = tmp_path_factory.mktemp("runs") / "stage1"
    res = runner.invoke(
        train_app,
        [
            "stage1",
            "--corpus",
            str(corpus),
            "--model",
            "tiny",
            "--out",
            str(out),
            "--max-steps",
            "24",
            "--lr",
            "3e-3",
            "--batch-size",
            "4",
            "--micro-batch-size",
            "4",
            "--max-length",
            "512",
            "--logging-steps",
            "2",
            "--save-steps",
            "12",
            "--tiny-vocab-size",
            "600",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "stage1: 24 steps" in res.output
    return out


# ---------------------------------------------------------------------------------------------
# data


def test_labels_are_the_assistant_tokens_only(tokenizer):
    conv = CONVERSATIONS[0]
    s = to_sample(tokenizer, conv)
    assert len(s.input_ids) == len(s.labels) and s.labels[0] == IGNORE_INDEX
    learned = [t for t in s.labels if t != IGNORE_INDEX]
    expected = "".join(m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant")
    assert tokenizer.decode(learned) == expected
    assert all(t == i for t, i in zip(s.labels, s.input_ids, strict=True) if t != IGNORE_INDEX)


def test_overlong_and_unlabelled_samples_are_dropped_and_counted(tokenizer):
    no_assistant = CONVERSATIONS[0][:2]
    long = [*CONVERSATIONS[1][:-1], {**CONVERSATIONS[1][-1], "content": "<think>x</think>" * 400}]
    samples, stats = build_samples(tokenizer, [CONVERSATIONS[0], no_assistant, long], 512)
    assert (stats.rows, stats.samples) == (3, 1)
    assert (stats.dropped_overlong, stats.dropped_no_assistant) == (1, 1)
    assert stats.tokens == len(samples[0]) == stats.longest


def test_packing_first_fit_decreasing_never_splits_or_overfills():
    samples = [Sample([1] * n, [1] * n) for n in (300, 200, 250, 100, 60, 500, 120)]
    rows = pack_samples(samples, 512)
    assert all(len(r) <= 512 for r in rows)
    assert sorted(len(s) for r in rows for s in r.samples) == sorted(len(s) for s in samples)
    assert [[len(s) for s in r.samples] for r in rows] == [[500], [300, 200], [250, 120, 100], [60]]
    feats = row_features(rows[1])
    assert feats["position_ids"] == list(range(300)) + list(range(200))


def test_collator_pads_with_ignored_labels_and_counts_tokens():
    batch = Collator(pad_token_id=0, pad_to_multiple_of=8)(
        [
            {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2]},
            {"input_ids": [5] * 10, "labels": [5] * 10, "position_ids": list(range(10))},
        ]
    )
    assert batch["input_ids"].shape == (2, 16)
    assert batch["labels"][0].tolist() == [-100, 6, 7] + [-100] * 13
    # padding continues the row's positions: one sample per row is a plain causal batch
    assert batch["position_ids"][0].tolist() == list(range(16))
    assert batch["position_ids"][1].tolist() == list(range(16))
    assert (int(batch["num_real_tokens"]), int(batch["num_padded_tokens"])) == (13, 32)
    assert "attention_mask" not in batch


# ---------------------------------------------------------------------------------------------
# the loss


def _model(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.config.use_cache = False
    return model


def _loss_and_grads(model, rows):
    batch = Collator(model.config.pad_token_id)([row_features(r) for r in rows])
    for k in ("num_real_tokens", "num_padded_tokens"):
        batch.pop(k)
    model.zero_grad()
    out = model(**batch)
    out.logits.retain_grad()
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out, batch, grads


def test_masked_tokens_contribute_nothing_to_loss_or_gradients(tiny_dir, tokenizer):
    import torch

    model = _model(tiny_dir)
    sample = to_sample(tokenizer, CONVERSATIONS[4])
    out, batch, grads = _loss_and_grads(model, [PackedRow([sample])])

    # d loss / d logits is exactly zero wherever the next token is masked
    target_masked = batch["labels"][0, 1:] == IGNORE_INDEX
    g = out.logits.grad[0, :-1]
    assert target_masked.any() and (~target_masked).any()
    assert torch.count_nonzero(g[target_masked]) == 0
    assert (g[~target_masked].abs().sum(-1) > 0).all()

    # the loss is the mean cross-entropy over the labelled tokens, nothing else
    logp = torch.log_softmax(out.logits[0, :-1].detach(), -1)
    tgt = batch["labels"][0, 1:]
    manual = -logp[~target_masked].gather(-1, tgt[~target_masked, None]).mean()
    assert torch.allclose(out.loss.detach(), manual, atol=1e-5)

    # change masked tokens (a trailing observation, other text in the masked turns' place):
    # loss and every gradient stay the same
    extra = [*CONVERSATIONS[4], {"role": "tool", "content": "<information>(x, y, z)</information>"}]
    changed = to_sample(tokenizer, extra)
    assert changed.input_ids[: len(sample)] == sample.input_ids and len(changed) > len(sample)
    out2, _, grads2 = _loss_and_grads(model, [PackedRow([changed])])
    assert torch.allclose(out.loss, out2.loss, atol=1e-6)
    for name, grad in grads.items():
        assert torch.allclose(grad, grads2[name], atol=1e-6), name


def test_logits_at_labelled_positions_only_give_the_same_loss_and_gradients(tiny_dir, tokenizer):
    import torch

    from kgsynth.train.sft_trainer import labelled_positions, masked_logits_supported

    model = _model(tiny_dir)
    assert masked_logits_supported(model)  # the installed transformers slices with a bool mask
    a, b, c = (to_sample(tokenizer, CONVERSATIONS[i]) for i in (0, 10, 20))
    rows = [PackedRow([a, b]), PackedRow([c])]  # a packed row beside a padded one
    full, batch, grads = _loss_and_grads(model, rows)

    keep, targets = labelled_positions(batch["labels"])
    assert 0 < int(keep.sum()) < keep.numel() // 2  # most positions need no logits
    model.zero_grad()
    out = model(**batch, logits_to_keep=keep, shift_labels=targets)
    out.loss.backward()
    assert out.logits.shape == (int(keep.sum()), model.config.vocab_size)
    assert torch.allclose(out.loss, full.loss, atol=1e-6)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, grads[name], atol=1e-7), name


def test_packed_samples_do_not_attend_to_each_other(tiny_dir, tokenizer):
    import torch

    model = _model(tiny_dir)
    a, b, c = (to_sample(tokenizer, CONVERSATIONS[i]) for i in (0, 10, 20))

    def token_logprobs(rows, which: int, offset: int, sample: Sample):
        batch = Collator(model.config.pad_token_id)([row_features(r) for r in rows])
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[
                which, offset : offset + len(sample)
            ]
        return torch.log_softmax(logits, -1)

    alone = token_logprobs([PackedRow([a])], 0, 0, a)
    after_b = token_logprobs([PackedRow([b, a])], 0, len(b), a)
    after_c = token_logprobs([PackedRow([c, a]), PackedRow([b])], 0, len(c), a)
    assert torch.allclose(alone, after_b, atol=1e-4)
    assert torch.allclose(alone, after_c, atol=1e-4)
    # a row padded to a longer neighbour: its padding continues its positions, and the real
    # tokens before it read the same
    padded = token_logprobs([PackedRow([a]), PackedRow([b, c])], 0, 0, a)
    assert torch.allclose(alone, padded, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# training runs


def test_stage1_loss_decreases_and_the_folder_reloads_and_generates(stage1: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    metrics = read_metrics(stage1 / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, *range(2, 25, 2)]
    assert all(0 < m["nonpad_fraction"] <= 1 and m["tokens_per_s"] > 0 for m in metrics)
    first, last = metrics[0]["loss"], metrics[-1]["loss"]
    assert last < first - 2.0, (first, last)
    assert (stage1 / "loss.png").stat().st_size > 1000
    manifest = json.loads((stage1 / "manifest.json").read_text())
    assert manifest["stage"] == "train stage1" and manifest["config"]["recipe"] == "tiny"
    assert manifest["config"]["lr"] == 3e-3 and manifest["config"]["max_length"] == 512
    assert manifest["input"]["rows"] == 24 and len(manifest["input"]["sha256"]) == 64
    assert manifest["data"]["samples"] == 24 and manifest["data"]["dropped_overlong"] == 0
    assert manifest["steps"] == 24 and manifest["wall_s"] > 0 and manifest["tokens_per_s"] > 0
    assert manifest["output"]["weights_sha256"] and manifest["parameters"] > 0
    assert sorted(p.name for p in (stage1 / "checkpoints").iterdir()) == [
        "checkpoint-12",
        "checkpoint-24",
    ]
    # every checkpoint carries the system prompt it was trained with, as the final folder does
    stored = (stage1 / "agent_system_prompt.txt").read_text()
    assert stored == system_prompt()
    for ck in (stage1 / "checkpoints").iterdir():
        assert (ck / "agent_system_prompt.txt").read_text() == stored

    tok = AutoTokenizer.from_pretrained(stage1)
    model = AutoModelForCausalLM.from_pretrained(stage1)
    assert tok.chat_template and model.config.use_cache
    prompt = tok.apply_chat_template(
        [
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": user_prompt("Who directed Heat?", ["Heat"])},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(gen[0, ids["input_ids"].shape[1] :])
    assert text.startswith("<think>"), text  # it learned how a turn starts


def test_resume_continues_the_same_run(corpus, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    cfg = SFTConfig(model="tiny", max_steps=6, save_steps=3, tiny_vocab_size=600, **FAST)
    straight = train_sft(prepare_run(cfg, "stage1", corpus, tmp_path / "a"))

    class Interrupt(Exception):
        pass

    class StopAtFour(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise Interrupt

    class CountSteps(TrainerCallback):
        steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            CountSteps.steps += 1

    spec = prepare_run(cfg, "stage1", corpus, tmp_path / "b")
    with pytest.raises(Interrupt):
        train_sft(spec, callbacks=[StopAtFour()])
    assert (tmp_path / "b" / "checkpoints" / "checkpoint-3").is_dir()
    resumed = train_sft(
        prepare_run(cfg, "stage1", corpus, tmp_path / "b"), callbacks=[CountSteps()]
    )

    assert resumed["resumed_from_step"] == 3 and CountSteps.steps == 3  # not from scratch
    assert resumed["steps"] == straight["steps"] == 6
    a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    for ma, mb in zip(a, b, strict=True):
        assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-5)
        assert ma["learning_rate"] == pytest.approx(mb["learning_rate"])
        assert ma["tokens"] == mb["tokens"]
    wa = load_file(tmp_path / "a" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "model.safetensors")
    for name, tensor in wa.items():
        assert torch.allclose(tensor, wb[name], atol=1e-6), name


def test_logits_at_labelled_positions_train_the_same_weights(corpus, tmp_path):
    import torch
    from safetensors.torch import load_file

    base = dict(model="tiny", max_steps=3, tiny_vocab_size=600, **FAST)
    runs = {}
    for logits in ("all", "labelled"):
        cfg = SFTConfig(**base, logits=logits)
        runs[logits] = train_sft(prepare_run(cfg, "stage1", corpus, tmp_path / logits))
        assert runs[logits]["logits"] == logits
    for a, b in zip(
        read_metrics(tmp_path / "all" / "metrics.jsonl"),
        read_metrics(tmp_path / "labelled" / "metrics.jsonl"),
        strict=True,
    ):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    w_all = load_file(tmp_path / "all" / "model.safetensors")
    w_lab = load_file(tmp_path / "labelled" / "model.safetensors")
    for name, tensor in w_all.items():
        assert torch.allclose(tensor, w_lab[name], atol=1e-5), name


@pytest.mark.parametrize("zero", [2, 3])
def test_deepspeed_zero_runs_on_cpu_and_matches_the_plain_path(corpus, tmp_path, zero):
    import torch
    from safetensors.torch import load_file

    # fp32 on every device: on CUDA "auto" trains in bf16, where the two paths' sums differ
    # in the third decimal of the loss
    base = dict(model="tiny", max_steps=2, tiny_vocab_size=600, precision="fp32", **FAST)
    train_sft(prepare_run(SFTConfig(**base), "stage1", corpus, tmp_path / "plain"))
    ds_cfg = SFTConfig(**base, deepspeed=f"zero{zero}")
    ds = train_sft(prepare_run(ds_cfg, "stage1", corpus, tmp_path / "ds"))

    assert ds["deepspeed"]["zero_optimization"]["stage"] == zero
    assert ds["steps"] == 2 and ds["gradient_accumulation_steps"] == 2
    m_plain = read_metrics(tmp_path / "plain" / "metrics.jsonl")
    m_ds = read_metrics(tmp_path / "ds" / "metrics.jsonl")
    for a, b in zip(m_plain, m_ds, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
    # the saved folder holds the full (gathered) weights, as the plain run's
    w_plain = load_file(tmp_path / "plain" / "model.safetensors")
    w_ds = load_file(tmp_path / "ds" / "model.safetensors")
    # (DeepSpeed's gathered state dict also names the tied output embedding)
    assert set(w_ds) - set(w_plain) <= {"lm_head.weight"}
    if "lm_head.weight" in w_ds:
        assert torch.equal(w_ds["lm_head.weight"], w_ds["model.embed_tokens.weight"])
    for name, tensor in w_plain.items():
        assert tensor.shape == w_ds[name].shape
        assert torch.allclose(tensor, w_ds[name], atol=1e-4), name
    assert (tmp_path / "ds" / "checkpoints" / "checkpoint-2" / "global_step2").is_dir()


def test_stage2_starts_from_stage1_weights_and_tokenizer(stage1: Path, corpus, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    seen: dict[str, torch.Tensor] = {}

    class Snapshot(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen.update({n: p.detach().clone() for n, p in model.state_dict().items()})

    cfg = SFTConfig(init=str(stage1), max_steps=2, **FAST)
    spec = prepare_run(cfg, "stage2", corpus, tmp_path / "stage2")
    assert spec.config.recipe == "tiny"  # taken from the stage-1 run
    train_sft(spec, callbacks=[Snapshot()])
    start = load_file(stage1 / "model.safetensors")
    for name, tensor in start.items():
        assert torch.equal(seen[name].cpu(), tensor), name  # (on the GPU where there is one)
    assert not (tmp_path / "stage2" / "init-tiny").exists()
    assert (tmp_path / "stage2" / "tokenizer.json").read_text() == (
        stage1 / "tokenizer.json"
    ).read_text()
    first_loss_2 = read_metrics(tmp_path / "stage2" / "metrics.jsonl")[0]["loss"]
    first_loss_1 = read_metrics(stage1 / "metrics.jsonl")[0]["loss"]
    assert first_loss_2 < first_loss_1 - 2.0


def test_stage2_cli_records_where_it_started(stage1: Path, corpus, tmp_path):
    out = tmp_path / "s2"
    args = ["stage2", "--corpus", str(corpus), "--init", str(stage1), "--out", str(out)]
    args += ["--no-packing"]  # one trajectory per row, length-grouped batches
    res = runner.invoke(train_app, [*args, "--max-steps", "1", "--batch-size", "4"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["packing"] is False
    assert manifest["data"]["training_rows"] == manifest["data"]["samples"] == 24
    stage1_manifest = json.loads((stage1 / "manifest.json").read_text())
    assert manifest["start_from"]["path"] == str(stage1)
    assert manifest["start_from"]["weights_sha256"] == stage1_manifest["output"]["weights_sha256"]
    # a finished run is never replaced unless asked
    weights = (out / "model.safetensors").read_bytes()
    res = runner.invoke(train_app, [*args, "--max-steps", "1", "--batch-size", "4"])
    assert res.exit_code == 2 and "finished run" in res.output and "--overwrite" in res.output
    assert (out / "model.safetensors").read_bytes() == weights
    # an unfinished one (no manifest yet: stopped before the end) resumes with the same
    # options (nothing left to do here) and refuses different ones
    (out / "manifest.json").unlink()
    res = runner.invoke(train_app, [*args, "--max-steps", "1", "--lr", "1e-4"])
    assert res.exit_code == 2 and "different lr" in res.output and "--overwrite" in res.output
    res = runner.invoke(train_app, [*args, "--max-steps", "1", "--batch-size", "4"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "manifest.json").read_text())["resumed_from_step"] == 1


# ---------------------------------------------------------------------------------------------
# CLI: launch commands and errors


def _stage1(corpus: Path, out: Path, *extra: str, model: str = "tiny") -> list[str]:
    return ["stage1", "--corpus", str(corpus), "--model", model, "--out", str(out), *extra]


def test_dry_run_prints_the_launch_commands(corpus, tmp_path):
    out = tmp_path / "never"
    res = runner.invoke(train_app, _stage1(corpus, out, "--dry-run"))
    assert res.exit_code == 0, res.output
    assert '"recipe": "tiny"' in res.output and '"lr": 0.001' in res.output
    assert "-m kgsynth.train.launch" in res.output

    ds = "zero3"
    res = runner.invoke(
        train_app, _stage1(corpus, out, "--dry-run", "--deepspeed", ds, "--nproc-per-node", "8")
    )
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "deepspeed --num_gpus 8 --num_nodes 1" in line
    assert line.endswith(f"--module kgsynth.train.launch {out / 'train_config.json'}")

    multi_node = ("--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1")
    res = runner.invoke(
        train_app, _stage1(corpus, out, "--dry-run", *multi_node, "--master-addr", "10.0.0.1")
    )
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "torchrun --nproc_per_node 4 --nnodes 2 --node_rank 1 --master_addr 10.0.0.1" in line
    assert not out.exists()

    res = runner.invoke(
        train_app, _stage1(corpus, out, "--dry-run", "--deepspeed", ds, *multi_node)
    )
    assert res.exit_code == 2 and "--hostfile" in res.output


def test_graphwalker_recipe_defaults(corpus, tiny_dir, tmp_path, caplog):
    res = runner.invoke(train_app, _stage1(corpus, tmp_path, "--dry-run", model=str(tiny_dir)))
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.output[: res.output.index("\n# ")])["config"]
    assert cfg["recipe"] == "graphwalker" and cfg["lr"] == 1e-5 and cfg["batch_size"] == 32
    assert cfg["epochs"] == 2 and cfg["lr_scheduler"] == "cosine"
    # the recipe's max_length 4096 (GraphWalker App. G Table 12), lowered to the tiny model's
    # 2,048 positions with one warning
    positions = json.loads((tiny_dir / "config.json").read_text())["max_position_embeddings"]
    assert positions < 4096 and cfg["max_length"] == positions
    assert "max_length 4096 is more than the model's" in caplog.text
    assert cfg["packing"] is False


def test_errors_name_the_option_and_the_fix(corpus, tmp_path):
    out = tmp_path / "o"
    res = runner.invoke(train_app, ["stage2", "--corpus", str(corpus), "--out", str(out)])
    assert res.exit_code == 2 and "--init" in res.output
    res = runner.invoke(train_app, _stage1(corpus, out, model=str(tmp_path / "nope")))
    assert res.exit_code == 2 and "not a local HF checkpoint" in res.output
    missing = str(tmp_path / "missing.json")
    res = runner.invoke(train_app, _stage1(corpus, out, "--deepspeed", missing))
    assert res.exit_code == 2 and "missing.json" in res.output
    res = runner.invoke(
        train_app, _stage1(corpus, out, "--batch-size", "6", "--micro-batch-size", "4")
    )
    assert res.exit_code == 2 and "multiple of micro_batch_size" in res.output
    res = runner.invoke(train_app, _stage1(corpus, out, "--logits", "some"))
    assert res.exit_code == 2 and "logits must be one of labelled, all" in res.output
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["q"]}), bad)
    res = runner.invoke(train_app, _stage1(bad, out))
    assert res.exit_code == 3 and "messages" in res.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    res = runner.invoke(train_app, _stage1(corpus, busy))
    assert res.exit_code == 2 and "not empty" in res.output
    assert (busy / "notes.txt").exists()
    # a run stopped while its tiny model was being built leaves only that: not a blocker
    stopped = tmp_path / "stopped"
    (stopped / "init-tiny").mkdir(parents=True)
    (stopped / "init-tiny" / "config.json").write_text("{}")
    spec = prepare_run(SFTConfig(model="tiny", max_steps=1), "stage1", corpus, stopped)
    assert (stopped / "train_config.json").is_file() and spec.stage == "stage1"
    assert json.loads((stopped / "init-tiny" / "config.json").read_text())["vocab_size"] > 0


# ---------------------------------------------------------------------------------------------
# multi-process (slow: each launch costs ~15 s of process start-up)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_two_processes_through_a_launcher(corpus, tmp_path, launcher):
    out = tmp_path / launcher
    args = _stage1(corpus, out)
    args += ["--max-steps", "2", "--batch-size", "4", "--micro-batch-size", "2"]
    args += ["--max-length", "512", "--tiny-vocab-size", "600", "--nproc-per-node", "2"]
    args += ["--launcher", launcher, "--master-port", str(_free_port())]
    if launcher == "deepspeed":
        args += ["--deepspeed", "zero2"]
    res = runner.invoke(train_app, args)
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["steps"] == 2
    assert manifest["gradient_accumulation_steps"] == 1
    assert (out / "model.safetensors").is_file()
    shutil.rmtree(out / "checkpoints")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_resume_passes_over_a_checkpoint_a_kill_cut_short(tmp_path: Path) -> None:
    from kgsynth.train.sft import last_complete_checkpoint

    ckpts = tmp_path / "checkpoints"
    assert last_complete_checkpoint(ckpts) is None
    for step, whole in ((6, True), (12, True), (18, False)):
        folder = ckpts / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w")
        if whole:  # the Trainer writes trainer_state.json last
            (folder / "trainer_state.json").write_text("{}")
    (ckpts / "checkpoint-99.tmp").mkdir()
    assert last_complete_checkpoint(ckpts) == str(ckpts / "checkpoint-12")


def test_checkpointing_option_follows_the_installed_transformers():
    """5.2x names it activation_checkpointing; older 5.x (the GPU image's 5.17) only
    gradient_checkpointing, which TrainingArguments there refuses the new name for."""
    import dataclasses

    from transformers import TrainingArguments

    from kgsynth.train.sft_trainer import _checkpointing_field

    @dataclasses.dataclass
    class Older:
        gradient_checkpointing: bool = False

    assert _checkpointing_field(Older) == "gradient_checkpointing"
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert _checkpointing_field(TrainingArguments) in names
