"""A kgsynth corpus trains in TRL as kgsynth trains it: the chat template's ``{% generation %}``
markers cover exactly the tokens kgsynth's own SFT puts in the loss, ``tool`` observations
render as ``user`` turns in both, the markers change no rendered byte, and TRL's
``SFTTrainer(assistant_only_loss=True)`` trains the tiny model on the corpus with labels equal
to kgsynth's (docs/corpus-format.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.render import for_template, render_messages
from kgsynth.cli import app
from kgsynth.llm.chat import CHATML_TEMPLATE
from kgsynth.train.data import IGNORE_INDEX, corpus_texts, read_corpus, to_sample
from tests.kgfixtures import build_pipeline_inputs

# Oracle trajectories in four action spaces (four turn formats), filtered as one pool: the
# per-question cap (3) rejects one of each question's four, so the folder has both files.
TOOLSETS = ("graphwalker", "kgr1", "knowcoder", "sexpr")

# CHATML_TEMPLATE as it was before the generation markers and the tool -> user mapping (commit
# 2f9de5c): what kgsynth rendered, byte for byte.
OLD_CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_oracle_corpus(root: Path) -> Path:
    """A kgsynth corpus folder made through the CLI: the movie KG imported and walked, template
    questions, oracle trajectories in :data:`TOOLSETS`, ``kgsynth filter`` over all of them."""
    paths = build_pipeline_inputs(root, walks=16, structures="chain-1:0.5,chain-2:0.5")
    runner = CliRunner()
    trajectories = []
    for toolset in TOOLSETS:
        out = root / f"trajectories_{toolset}.parquet"
        res = runner.invoke(
            app,
            ["synthesize", "trajectories", "--questions", str(paths["questions"]), "--kg",
             str(paths["store"]), "--mode", "oracle", "--llm", "template", "--toolset",
             toolset, "--out", str(out)],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        trajectories.append(out)
    corpus = root / "corpus"
    args = ["filter", "--out", str(corpus)]
    for path in trajectories:
        args += ["--in", str(path)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return build_oracle_corpus(tmp_path_factory.mktemp("trl-corpus"))


@pytest.fixture(scope="module")
def conversations(corpus) -> list[list[dict[str, str]]]:
    return read_corpus(corpus / "accepted.parquet")


@pytest.fixture(scope="module")
def tiny_dir(conversations, tmp_path_factory) -> Path:
    """The tiny model ``train stage1 --model tiny`` builds: its tokenizer learnt on the corpus."""
    from kgsynth.train.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    return build_tiny_model(corpus_texts(conversations), out, vocab_size=800, seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def test_the_corpus_has_every_role_and_the_tokenizer_carries_the_template(
    conversations, tokenizer, corpus
):
    assert tokenizer.chat_template == CHATML_TEMPLATE
    roles = {m["role"] for conv in conversations for m in conv}
    assert roles == {"system", "user", "assistant", "tool"}
    assert len(conversations) >= 20
    assert pq.read_metadata(corpus / "rejected.parquet").num_rows > 0


def test_generation_markers_mask_exactly_kgsynths_loss_tokens(conversations, tokenizer):
    """Every row: the template's assistant mask and input ids equal kgsynth's renderer's, and
    kgsynth's SFT labels are those ids where the mask is 1 (the first token aside)."""
    for i, messages in enumerate(conversations):
        enc = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ours = render_messages(tokenizer, messages)
        assert enc["input_ids"] == ours.input_ids, f"row {i}"
        assert enc["assistant_masks"] == ours.loss_mask, f"row {i}"
        sample = to_sample(tokenizer, messages)
        expected = [
            t if m else IGNORE_INDEX for t, m in zip(ours.input_ids, ours.loss_mask, strict=True)
        ]
        assert sample.labels[1:] == expected[1:], f"row {i}"
        # the masked tokens are the assistant turns with their end-of-turn token, nothing else
        masked = tokenizer.decode(
            [t for t, m in zip(ours.input_ids, ours.loss_mask, strict=True) if m]
        )
        turns = "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
        assert masked == turns, f"row {i}"


def test_tool_messages_render_as_user_turns_in_template_and_trainer(conversations, tokenizer):
    for messages in conversations:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        assert text == render_messages(tokenizer, messages).text
        assert "<|im_start|>tool" not in text
        observations = [m["content"] for m in messages if m["role"] == "tool"]
        assert observations and all(
            f"<|im_start|>user\n{o}<|im_end|>" in text for o in observations
        )


def test_markers_render_nothing(conversations, tokenizer):
    """The new template renders what the old one did, byte for byte, on every conversation
    kgsynth renders (observations already user turns), with or without a generation prompt,
    and on the message shapes the hf backend passes (text parts, no content)."""
    shapes = [
        [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}],
        [{"role": "system", "content": "s"}, {"role": "assistant", "content": None}],
        [
            {"role": "user", "content": ""},
            {"role": "assistant", "content": "\n<answer>x</answer>\n"},
        ],
    ]
    rendered = 0
    for messages in [for_template(c) for c in conversations] + shapes:
        for prompt in (False, True):
            old, new = (
                tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=prompt, chat_template=t
                )
                for t in (OLD_CHATML_TEMPLATE, CHATML_TEMPLATE)
            )
            assert new == old
            rendered += 1
    assert rendered == 2 * (len(conversations) + len(shapes))


def test_trl_counts_the_end_of_turn_token_as_the_assistants(tokenizer):
    chat_template_utils = pytest.importorskip("trl.chat_template_utils")
    assert chat_template_utils.has_generation_markers(tokenizer.chat_template)
    assert chat_template_utils.is_chat_template_stop_token_trained(tokenizer)


def test_trl_sft_trainer_trains_on_kgsynths_tokens(corpus, conversations, tiny_dir, tmp_path):
    """TRL's SFTTrainer on the corpus folder as ``datasets`` loads it (through the card), with
    ``assistant_only_loss=True``: its labels equal kgsynth's for every row, and three steps on
    the CPU give a finite loss and move the weights."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    train = datasets.load_dataset(str(corpus), split="train", cache_dir=str(tmp_path / "hf"))
    assert train.num_rows == len(conversations)
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        assistant_only_loss=True,
        max_length=None,
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)

    rows = trainer.train_dataset
    assert rows.num_rows == len(conversations)
    for i, messages in enumerate(conversations):
        sample = to_sample(tokenizer, messages)
        assert rows[i]["input_ids"] == sample.input_ids, f"row {i}"
        batch = trainer.data_collator([rows[i]])
        labels = batch["labels"][0].tolist()
        # kgsynth also ignores a sample's first token (a packed row's boundary); it is the
        # system turn's <|im_start|>, outside both masks
        assert labels[0] == IGNORE_INDEX
        assert labels[1:] == sample.labels[1:], f"row {i}"

    result = trainer.train()
    assert trainer.state.global_step == 3
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)
    assert math.isfinite(result.training_loss)
    moved = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert moved


def test_the_documented_trl_snippet_runs(corpus, tiny_dir, tmp_path, monkeypatch):
    """docs/corpus-format.md's TRL code, as written, with the run folder's paths pointed at this
    test's corpus and tiny model."""
    doc = Path(__file__).resolve().parents[1] / "docs" / "corpus-format.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL)
    snippet = next(b for b in blocks if "SFTTrainer(" in b)
    for placeholder, real in (
        ("runs/default/corpus", corpus),
        ("runs/default/stage1", tiny_dir),
        ("runs/trl-sft", tmp_path / "trl-sft"),
    ):
        assert f'"{placeholder}"' in snippet
        snippet = snippet.replace(f'"{placeholder}"', repr(str(real)))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    namespace: dict = {}
    exec(compile(snippet, str(doc), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.args.assistant_only_loss and trainer.state.global_step > 0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)
