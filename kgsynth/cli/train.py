"""``kgsynth train stage1|stage2``: SFT of the agent policy (see :mod:`kgsynth.train.sft`).

Parses options, prepares the run folder, trains in this process or through the deepspeed
launcher / torchrun, and writes ``manifest.json``; no logic lives here.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kgsynth.cli.common import err, fail, out, progress_bar
from kgsynth.cli.options import (
    KGOption,
    MaxTurnsOption,
    ProfileOption,
    RelationRankingOption,
    ReportToOption,
    ToolsOption,
)
from kgsynth.errors import KGSynthError

train_app = typer.Typer(
    help="Supervised fine-tuning of the agent: stage1 (synthetic trajectories), stage2 "
    "(expert trajectories, from stage1's weights).",
    no_args_is_help=True,
)

CorpusOption = Annotated[
    Path,
    typer.Option(
        "--corpus", help="Trajectory Parquet with a messages column (corpus/accepted.parquet)."
    ),
]
OutOption = Annotated[
    Path, typer.Option("--out", help="Run folder; ends up a save_pretrained model folder.")
]
RecipeOption = Annotated[
    str | None,
    typer.Option(
        help="Defaults: graphwalker (lr 1e-5, batch 32, 2 epochs, 4096 tokens) or tiny (CPU). "
        "\\[default: tiny for --model tiny, else graphwalker]"
    ),
]
EpochsOption = Annotated[float | None, typer.Option(help="Epochs. \\[default: recipe's]")]
MaxStepsOption = Annotated[
    int | None, typer.Option(help="Optimizer steps; overrides --epochs when set.")
]
LrOption = Annotated[float | None, typer.Option(help="Peak learning rate. \\[default: recipe's]")]
BatchOption = Annotated[
    int | None,
    typer.Option(
        help="Global batch: rows per optimizer step (trajectories, or packed rows with "
        "--packing). \\[default: recipe's]"
    ),
]
MicroOption = Annotated[
    int | None,
    typer.Option(
        help="Rows per device per forward pass; gradient accumulation makes up the rest. "
        "\\[default: recipe's]"
    ),
]
MaxLenOption = Annotated[
    int | None,
    typer.Option(help="Tokens per row; longer trajectories are dropped and counted."),
]
PackingOption = Annotated[
    bool | None,
    typer.Option(
        "--packing/--no-packing",
        help="Pack trajectories into rows (else length-bucketed batches). \\[default: recipe's]",
    ),
]
WarmupOption = Annotated[
    float | None, typer.Option(help="Warmup as a fraction of the steps. \\[default: 0.03]")
]
SchedulerOption = Annotated[
    str | None, typer.Option(help="cosine, linear or constant_with_warmup. \\[default: cosine]")
]
SeedOption = Annotated[int | None, typer.Option(help="Seed. \\[default: 0]")]
LogStepsOption = Annotated[
    int | None, typer.Option(help="Write metrics every N steps. \\[default: recipe's]")
]
SaveStepsOption = Annotated[
    int | None, typer.Option(help="Checkpoint every N steps. \\[default: recipe's]")
]
DeepSpeedOption = Annotated[
    str | None,
    typer.Option(help="DeepSpeed ZeRO config (train/ds_zero0.json, ds_zero2.json, ds_zero3.json)."),
]
PrecisionOption = Annotated[
    str | None,
    typer.Option(help="auto (bf16 on a CUDA GPU, fp32 on CPU), bf16 or fp32. \\[default: auto]"),
]
GradCkptOption = Annotated[
    bool | None,
    typer.Option(
        "--gradient-checkpointing/--no-gradient-checkpointing",
        help="Recompute activations to save memory. \\[default: off]",
    ),
]
AttnOption = Annotated[
    str | None,
    typer.Option(help="sdpa, eager or flash_attention_2. \\[default: sdpa]"),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(help="YAML file with these options (a stage1:/stage2: section or flat)."),
]
OverwriteOption = Annotated[
    bool,
    typer.Option(
        help="Delete an earlier run in --out (a finished one, or one with other options) and "
        "train afresh; without it an unfinished run of the same options is resumed."
    ),
]
LoraROption = Annotated[
    int | None,
    typer.Option(
        "--lora-r",
        help="Train LoRA adapters of this rank (PEFT) instead of every weight; the run folder "
        "keeps the adapter (`kgsynth train merge` writes full weights). \\[default: 0, no LoRA]",
    ),
]
LoraAlphaOption = Annotated[
    float | None, typer.Option("--lora-alpha", help="LoRA scaling alpha. \\[default: 16]")
]
LoraDropoutOption = Annotated[
    float | None, typer.Option("--lora-dropout", help="LoRA dropout. \\[default: 0.05]")
]
LoraTargetOption = Annotated[
    str | None,
    typer.Option(
        "--lora-target",
        help="Modules that get adapters: comma-separated names (q_proj,v_proj) or all-linear. "
        "\\[default: all-linear]",
    ),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Print the resolved configuration and the launch command; train nothing."
    ),
]
NprocOption = Annotated[int, typer.Option(help="Processes (GPUs) per node; > 1 starts a launcher.")]
NnodesOption = Annotated[int, typer.Option(help="Nodes.")]
NodeRankOption = Annotated[int, typer.Option(help="This node's rank (torchrun).")]
MasterAddrOption = Annotated[str, typer.Option(help="Address of the rank-0 node.")]
MasterPortOption = Annotated[int, typer.Option(help="Port of the rank-0 node.")]
LauncherOption = Annotated[
    str,
    typer.Option(
        help="auto (none for one process, deepspeed with --deepspeed, else torchrun), none, "
        "torchrun or deepspeed."
    ),
]
HostfileOption = Annotated[
    str | None, typer.Option(help="DeepSpeed hostfile for a multi-node deepspeed launch.")
]


@train_app.command("stage1")
def stage1_cmd(
    corpus: CorpusOption,
    out_dir: OutOption,
    model: Annotated[
        str | None,
        typer.Option(
            help="A local HF checkpoint folder, or 'tiny' (a small Qwen2 built offline, its "
            "tokenizer trained on the corpus)."
        ),
    ] = None,
    recipe: RecipeOption = None,
    epochs: EpochsOption = None,
    max_steps: MaxStepsOption = None,
    lr: LrOption = None,
    batch_size: BatchOption = None,
    micro_batch_size: MicroOption = None,
    max_length: MaxLenOption = None,
    packing: PackingOption = None,
    warmup_ratio: WarmupOption = None,
    lr_scheduler: SchedulerOption = None,
    seed: SeedOption = None,
    logging_steps: LogStepsOption = None,
    save_steps: SaveStepsOption = None,
    deepspeed: DeepSpeedOption = None,
    precision: PrecisionOption = None,
    gradient_checkpointing: GradCkptOption = None,
    attn_implementation: AttnOption = None,
    tiny_hidden_size: Annotated[
        int | None, typer.Option(help="tiny: hidden size. \\[default: 64]")
    ] = None,
    tiny_layers: Annotated[int | None, typer.Option(help="tiny: layers. \\[default: 2]")] = None,
    tiny_vocab_size: Annotated[
        int | None, typer.Option(help="tiny: BPE vocabulary cap. \\[default: 2000]")
    ] = None,
    tiny_heads: Annotated[
        int | None, typer.Option(help="tiny: attention heads. \\[default: 4]")
    ] = None,
    copy_drills: Annotated[
        int | None,
        typer.Option(
            help="Short name-copy conversations made from the corpus's own entity names, mixed "
            "into the training rows (teaches a model trained from scratch to copy names). "
            "\\[default: recipe's]"
        ),
    ] = None,
    copy_warmup_steps: Annotated[
        int | None,
        typer.Option(
            help="Steps on name-copy drills (batches of 32, from the corpus's own entity names) "
            "before the trajectories: a model trained from scratch learns to copy names in a "
            "minute this way. \\[default: recipe's]"
        ),
    ] = None,
    tiny_init_std: Annotated[
        float | None, typer.Option(help="tiny: normal-init spread of the weights. \\[default: 0.1]")
    ] = None,
    report_to: ReportToOption = None,
    lora_r: LoraROption = None,
    lora_alpha: LoraAlphaOption = None,
    lora_dropout: LoraDropoutOption = None,
    lora_target: LoraTargetOption = None,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
    dry_run: DryRunOption = False,
    nproc_per_node: NprocOption = 1,
    nnodes: NnodesOption = 1,
    node_rank: NodeRankOption = 0,
    master_addr: MasterAddrOption = "127.0.0.1",
    master_port: MasterPortOption = 29500,
    launcher: LauncherOption = "auto",
    hostfile: HostfileOption = None,
) -> None:
    """Stage 1 SFT: from --model (a checkpoint folder or 'tiny') on synthetic trajectories."""
    overrides = dict(locals())
    _train("stage1", overrides)


@train_app.command("stage2")
def stage2_cmd(
    corpus: CorpusOption,
    out_dir: OutOption,
    init: Annotated[
        str | None, typer.Option(help="The stage-1 output folder (weights and tokenizer).")
    ] = None,
    recipe: RecipeOption = None,
    epochs: EpochsOption = None,
    max_steps: MaxStepsOption = None,
    lr: LrOption = None,
    batch_size: BatchOption = None,
    micro_batch_size: MicroOption = None,
    max_length: MaxLenOption = None,
    packing: PackingOption = None,
    warmup_ratio: WarmupOption = None,
    lr_scheduler: SchedulerOption = None,
    seed: SeedOption = None,
    logging_steps: LogStepsOption = None,
    save_steps: SaveStepsOption = None,
    deepspeed: DeepSpeedOption = None,
    precision: PrecisionOption = None,
    gradient_checkpointing: GradCkptOption = None,
    attn_implementation: AttnOption = None,
    report_to: ReportToOption = None,
    lora_r: LoraROption = None,
    lora_alpha: LoraAlphaOption = None,
    lora_dropout: LoraDropoutOption = None,
    lora_target: LoraTargetOption = None,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
    dry_run: DryRunOption = False,
    nproc_per_node: NprocOption = 1,
    nnodes: NnodesOption = 1,
    node_rank: NodeRankOption = 0,
    master_addr: MasterAddrOption = "127.0.0.1",
    master_port: MasterPortOption = 29500,
    launcher: LauncherOption = "auto",
    hostfile: HostfileOption = None,
) -> None:
    """Stage 2 SFT: from stage 1's folder (--init) on expert or rejection-sampled trajectories."""
    overrides = dict(locals())
    _train("stage2", overrides)


_RUN_OPTIONS = ("corpus", "out_dir", "config", "overwrite", "dry_run")
_LAUNCH_OPTIONS = (
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "launcher",
    "hostfile",
)


def _train(stage: str, options: dict[str, Any]) -> None:
    from kgsynth.config import build_config
    from kgsynth.stage_io import OutputLock, check_folder_target, check_overlap, recover_input
    from kgsynth.train.launch import LaunchConfig, launch_command, resolve_launcher
    from kgsynth.train.sft import SPEC, SFTConfig, prepare_run, resolve_config

    started = time.perf_counter()
    corpus: Path = options["corpus"]
    out_dir: Path = options["out_dir"]
    launch = LaunchConfig(**{k: options[k] for k in _LAUNCH_OPTIONS})
    overrides = {
        k: v for k, v in options.items() if k not in _RUN_OPTIONS and k not in _LAUNCH_OPTIONS
    }
    try:
        cfg = build_config(SFTConfig, options["config"], overrides, section=stage)
        launcher = resolve_launcher(launch, cfg.deepspeed is not None)
        spec_path = out_dir / SPEC
        if launcher == "none":
            command = [sys.executable, "-m", "kgsynth.train.launch", str(spec_path)]
        else:
            command = launch_command(spec_path, launch, launcher)
        if options["dry_run"]:
            resolved = resolve_config(cfg, stage)
            out.print_json(
                data={
                    "stage": stage,
                    "corpus": str(corpus),
                    "out": str(out_dir),
                    "config": dataclasses.asdict(resolved),
                    "launcher": launcher,
                    "world_size": launch.world_size,
                }
            )
            where = "in this process, equivalent to" if launcher == "none" else "command"
            out.print(f"# {where}:\n{shlex.join(command)}", highlight=False, soft_wrap=True)
            return
        check_folder_target(out_dir)
        check_overlap(
            [out_dir], [("--corpus", corpus), ("--init", cfg.init), ("--config", options["config"])]
        )
        # one run per folder: a second one on it fails at once (the lock goes with the process)
        with OutputLock(out_dir):
            recover_input(corpus)
            with err.status("reading the corpus and preparing the run folder…"):
                spec = prepare_run(cfg, stage, corpus, out_dir, overwrite=options["overwrite"])
            if launcher == "none":
                summary = _train_here(spec, err)
            else:
                summary = _train_launched(command, out_dir, err)
            if summary is None:  # a torchrun node other than rank 0's
                return
            manifest = _write_manifest(spec, launch, launcher, command, summary, started)
    except KGSynthError as exc:
        fail(exc)
    loss_a, loss_b = manifest["loss_first"], manifest["loss_last"]
    data = manifest["data"]
    out.print(
        f"{stage}: {manifest['steps']} steps ({manifest['epochs_done']:.2f} epochs) "
        f"in {manifest['wall_s']:.1f}s, loss {loss_a:.3f} → {loss_b:.3f}, "
        f"{manifest['tokens_per_s']:,.0f} tokens/s, non-padding {manifest['nonpad_fraction']:.0%}; "
        f"{data['samples']:,} of {data['rows']:,} trajectories "
        f"({data['dropped_overlong']} over-long dropped) → {out_dir}",
        highlight=False,
    )


def _train_here(spec: Any, err: Any) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from kgsynth.train.sft import train_sft

    hf_logging.disable_progress_bar()  # the bar below is the progress
    with progress_bar(spec.stage, console=err) as bar:
        task = bar.add_task("train", total=None, info="")

        def progress(step: int, max_steps: int, logs: dict) -> None:
            info = (
                f"loss {logs['loss']:.3f}, {logs['tokens_per_s']:,.0f} tokens/s"
                if "loss" in logs
                else None
            )
            bar.update(task, completed=step, total=max_steps or None)
            if info:
                bar.update(task, info=info)

        return train_sft(spec, progress=progress)


def _train_launched(
    command: list[str], out_dir: Path, err: Any, summary_name: str | None = None
) -> dict[str, Any] | None:
    import json

    from kgsynth.train.sft import SUMMARY

    err.print(f"launching: {shlex.join(command)}", highlight=False, soft_wrap=True)
    summary_path = out_dir / (summary_name or SUMMARY)
    summary_path.unlink(missing_ok=True)
    try:
        rc = subprocess.run(command, check=False).returncode
    except OSError as exc:
        raise KGSynthError(f"cannot start {command[0]}: {exc.strerror}") from None
    if rc != 0:
        raise KGSynthError(f"{Path(command[0]).name} exited with status {rc}; see its output above")
    if not summary_path.is_file():
        return None
    return json.loads(summary_path.read_text())


def _write_manifest(
    spec: Any,
    launch: Any,
    launcher: str,
    command: list[str],
    summary: dict[str, Any],
    started: float,
) -> dict[str, Any]:
    from kgsynth.manifest import sha256_file, write_manifest

    run_dir = Path(spec.out)
    start_from: dict[str, Any] = {"path": str(spec.model_path)}
    weights = spec.model_path / "model.safetensors"
    if weights.is_file():
        start_from["weights_sha256"] = sha256_file(weights)
    final = run_dir / "model.safetensors"
    return write_manifest(
        run_dir / "manifest.json",
        stage=f"train {spec.stage}",
        config=dataclasses.asdict(spec.config),
        launch={
            **dataclasses.asdict(launch),
            "launcher": launcher,
            "command": shlex.join(command),
        },
        input={
            "corpus": spec.corpus,
            "sha256": sha256_file(spec.corpus),
            "rows": summary["data"]["rows"],
        },
        start_from=start_from,
        output={
            "path": str(run_dir),
            "weights_sha256": sha256_file(final) if final.is_file() else None,
            "bytes": sum(f.stat().st_size for f in run_dir.glob("*") if f.is_file()),
        },
        elapsed_s=round(time.perf_counter() - started, 3),
        **{k: v for k, v in summary.items() if k != "stage"},
    )


def _preset_base(preset: str | None, config: Path | None) -> dict[str, Any]:
    """The GRPOConfig fields of the preset named by --preset or the config file's ``preset``."""
    from kgsynth.config import load_yaml
    from kgsynth.train.presets import preset_values

    name = preset
    if name is None and config is not None:
        name = load_yaml(config, "rl").get("preset")
    if name is None:
        return {}
    if not isinstance(name, str):
        raise KGSynthError(f"--config: {config}: preset must be a name (got {name!r})")
    return preset_values(name)


@train_app.command("rl")
def rl_cmd(
    questions: Annotated[
        Path,
        typer.Option(
            help="Questions with topic entities and gold answers: questions.parquet from "
            "`synthesize questions`, MetaQA txt or JSONL."
        ),
    ],
    out_dir: OutOption,
    init: Annotated[
        str, typer.Option(help="The SFT output folder to start from (stage2, or stage1).")
    ],
    kg: KGOption = None,
    profile: ProfileOption = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            help="Defaults: default (lr 1e-6, group 8, 16 questions/step) or tiny (CPU). "
            "\\[default: tiny when --init is a tiny SFT run]"
        ),
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="A seed paper's whole RL recipe: graphwalker, kbqa-r1, knowcoder-a1, kg-r1 or "
            "isp (rewards, advantage, KL, clip, group, turns, lr, warm-up; the README's preset "
            "table gives each value and its source). --config and flags override it.",
        ),
    ] = None,
    reward: Annotated[
        str | None,
        typer.Option(
            help="Reward: a preset (graphwalker = hit, kbqa-r1, knowcoder-a1, kg-r1, isp) or "
            "name:weight,... over em, f1, fbeta, format, retrieval, turn, distance. "
            "\\[default: em]"
        ),
    ] = None,
    fbeta_switch_step: Annotated[
        int | None, typer.Option(help="fbeta curriculum: beta 0.5 until this step, then 1.")
    ] = None,
    fbeta_switch_reward: Annotated[
        float | None,
        typer.Option(
            help="fbeta curriculum: beta 1 from the step after the outcome reward's running mean "
            "reaches this (the switch never goes back)."
        ),
    ] = None,
    phase2_questions: Annotated[
        Path | None,
        typer.Option(
            help="fbeta curriculum: questions of the second phase (after the switch); "
            "KnowCoder-A1's per-phase question sets. \\[default: --questions throughout]"
        ),
    ] = None,
    group_size: Annotated[
        int | None, typer.Option(help="Rollouts per question (G). \\[default: recipe's]")
    ] = None,
    questions_per_step: Annotated[
        int | None, typer.Option(help="Questions per step. \\[default: recipe's]")
    ] = None,
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps. \\[default: 50]")] = None,
    lr: LrOption = None,
    warmup_steps: Annotated[
        int | None, typer.Option(help="Linear learning-rate warm-up steps. \\[default: 0]")
    ] = None,
    rl_warmup_ratio: Annotated[
        float | None,
        typer.Option(
            "--warmup-ratio",
            help="Warm-up as a share of --max-steps (KBQA-R1: 0.3); wins over --warmup-steps.",
        ),
    ] = None,
    kl: Annotated[
        float | None,
        typer.Option(
            "--kl", help="KL coefficient to the frozen init model (k3); 0 = off. \\[default: 0.001]"
        ),
    ] = None,
    clip_low: Annotated[
        float | None, typer.Option(help="Ratio clip below: 1 - clip_low. \\[default: 0.2]")
    ] = None,
    clip_high: Annotated[
        float | None, typer.Option(help="Ratio clip above: 1 + clip_high (DAPO). \\[default: 0.28]")
    ] = None,
    scale_rewards: Annotated[
        bool | None,
        typer.Option(
            "--scale-rewards/--no-scale-rewards",
            help="Divide advantages by the group std. \\[default: scale-rewards]",
        ),
    ] = None,
    turn_advantage: Annotated[
        bool | None,
        typer.Option(
            "--turn-advantage/--no-turn-advantage",
            help="KG-R1's turn-wise advantage: each turn's tokens get G_t = r_t + lambda R (turn "
            "rewards plus the trajectory reward) against one baseline pooled over every turn "
            "of the group. \\[default: no-turn-advantage; on in --preset kg-r1 and isp]",
        ),
    ] = None,
    turn_lambda: Annotated[
        float | None,
        typer.Option(help="KG-R1's lambda: the trajectory reward's weight in G_t. \\[default: 1]"),
    ] = None,
    updates_per_step: Annotated[
        int | None,
        typer.Option(
            help="Updates on each step's rollouts; 1 = on-policy single update. \\[default: 1]"
        ),
    ] = None,
    micro_batch_size: Annotated[
        int | None, typer.Option(help="Rollouts per forward pass. \\[default: 8]")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature of rollouts. \\[default: 1.0]")
    ] = None,
    max_turns: MaxTurnsOption = None,
    max_turn_tokens: Annotated[
        int | None, typer.Option(help="Generated tokens per turn. \\[default: recipe's]")
    ] = None,
    max_obs_tokens: Annotated[
        int | None, typer.Option(help="Observation tokens kept per call. \\[default: 512]")
    ] = None,
    rollout_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds per rollout before it is ended where it is. \\[default: 300]"),
    ] = None,
    tools: ToolsOption = None,
    relation_ranking: RelationRankingOption = None,
    report_to: ReportToOption = None,
    lora_r: LoraROption = None,
    lora_alpha: LoraAlphaOption = None,
    lora_dropout: LoraDropoutOption = None,
    lora_target: LoraTargetOption = None,
    save_steps: Annotated[
        int | None, typer.Option(help="Checkpoint every N steps. \\[default: 25]")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed. \\[default: 0]")] = None,
    deepspeed: DeepSpeedOption = None,
    precision: PrecisionOption = None,
    config: Annotated[
        Path | None, typer.Option(help="YAML file with these options (an rl: section or flat).")
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(help="Replace an earlier run in --out (a folder kgsynth wrote)."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the resolved configuration; train nothing.")
    ] = False,
    nproc_per_node: NprocOption = 1,
    nnodes: NnodesOption = 1,
    node_rank: NodeRankOption = 0,
    master_addr: MasterAddrOption = "127.0.0.1",
    master_port: MasterPortOption = 29500,
    launcher: LauncherOption = "auto",
    hostfile: HostfileOption = None,
) -> None:
    """GRPO against the live KG: multi-turn rollouts with the KG tools, the seeds' rewards.
    With --nproc-per-node N, N processes (torchrun, or the deepspeed launcher with
    --deepspeed) each roll out whole groups of the step's questions and step together."""
    from kgsynth.config import build_config
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.stage_io import StagedOutput
    from kgsynth.train.grpo import (
        GRPOConfig,
        RLSpec,
        read_rl_questions,
        resolve_config,
        train_grpo,
    )
    from kgsynth.train.launch import LaunchConfig, launch_command, resolve_launcher

    started = time.perf_counter()
    overrides = dict(
        init=init, recipe=recipe, preset=preset, reward=reward, fbeta_switch_step=fbeta_switch_step,
        fbeta_switch_reward=fbeta_switch_reward,
        phase2_questions=str(phase2_questions) if phase2_questions else None,
        group_size=group_size, turn_lambda=turn_lambda, warmup_steps=warmup_steps,
        warmup_ratio=rl_warmup_ratio,
        questions_per_step=questions_per_step, max_steps=max_steps, lr=lr, kl_coef=kl,
        clip_low=clip_low, clip_high=clip_high, scale_rewards=scale_rewards,
        turn_advantage=turn_advantage, updates_per_step=updates_per_step,
        micro_batch_size=micro_batch_size, temperature=temperature, max_turns=max_turns,
        max_turn_tokens=max_turn_tokens, max_obs_tokens=max_obs_tokens,
        rollout_timeout_s=rollout_timeout, toolset=tools, relation_ranking=relation_ranking, report_to=report_to, lora_r=lora_r, lora_alpha=lora_alpha,
        lora_dropout=lora_dropout, lora_target=lora_target, save_steps=save_steps, seed=seed,
        deepspeed=deepspeed, precision=precision,
    )  # fmt: skip
    try:
        cfg = resolve_config(
            build_config(
                GRPOConfig, config, overrides, section="rl", base=_preset_base(preset, config)
            )
        )
        given = locals()
        launch = LaunchConfig(**{k: given[k] for k in _LAUNCH_OPTIONS})
        launch_with = resolve_launcher(launch, cfg.deepspeed is not None)
        spec_name = "rl_spec.json"
        if dry_run:
            command = (
                launch_command(out_dir / spec_name, launch, launch_with)
                if launch_with != "none" else None
            )  # fmt: skip
            out.print_json(data={"questions": str(questions), "kg": kg, "out": str(out_dir),
                                 "config": dataclasses.asdict(cfg), "launcher": launch_with,
                                 "world_size": launch.world_size,
                                 "command": shlex.join(command) if command else None})  # fmt: skip
            return
        qs = read_rl_questions(questions)
        staged = StagedOutput(
            out_dir,
            folder=True,
            overwrite=overwrite,
            # without --overwrite, a killed run's checkpoints stay and train_grpo goes on from the last
            resume=not overwrite,
            inputs=[
                ("--questions", questions),
                ("--kg", kg),
                ("--init", cfg.init),
                ("--config", config),
                ("--phase2-questions", cfg.phase2_questions),
            ],
        )
        with staged:
            spec = RLSpec(str(questions), kg or "", profile, str(staged.staging), cfg)
            if kg is None:
                from kgsynth.kg.open import DEFAULT_KG

                spec = dataclasses.replace(spec, kg=str(DEFAULT_KG))
            with progress_bar("rl", console=err) as bar:
                task = bar.add_task("rl", total=cfg.max_steps, info="")

                def progress(step: int, total: int, row: dict) -> None:
                    bar.update(
                        task,
                        completed=step,
                        info=f"reward {row['reward']:.3f}, kl {row['kl']:.4f}, "
                        f"{row['step_s']:.1f}s/step, skipped {row['skipped_groups']}/{row['groups']}",
                    )

                if launch_with == "none":
                    summary = train_grpo(spec, progress=progress, questions=qs)
                else:
                    spec.write(staged.path(spec_name))
                    command = launch_command(staged.path(spec_name), launch, launch_with)
                    launched = _train_launched(command, staged.staging, err, "rl_summary.json")
                    if launched is None:  # a torchrun node other than rank 0's
                        return
                    summary = launched
            manifest = write_manifest(
                staged.path("manifest.json"),
                stage="train rl",
                config=dataclasses.asdict(cfg),
                input={
                    "questions": str(questions),
                    "sha256": sha256_file(questions),
                    "rows": len(qs),
                    "kg": spec.kg,
                },
                start_from={"path": str(cfg.init)},
                output={"path": str(out_dir)},
                elapsed_s=round(time.perf_counter() - started, 3),
                **summary,
            )
            staged.commit()
    except KGSynthError as exc:
        fail(exc)
    out.print(
        f"rl: {manifest['steps']} steps in {manifest['wall_s']:.1f}s, reward "
        f"{manifest['reward_first']:.3f} → {manifest['reward_last']:.3f} (first/last fifth), "
        f"{manifest['mean_step_s']:.1f}s/step, {manifest['mean_rollout_tokens_per_s']:,.0f} rollout "
        f"tokens/s, {manifest['skipped_groups']} of {manifest['groups']} groups skipped "
        f"(equal rewards) → {out_dir}",
        highlight=False,
    )


@train_app.command("merge")
def merge_cmd(
    run: Annotated[Path, typer.Argument(help="A LoRA run folder (stage1, stage2 or rl).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the merged full model.")],
    overwrite: Annotated[
        bool, typer.Option(help="Replace an earlier merge in --out (a folder kgsynth wrote).")
    ] = False,
) -> None:
    """Fold a LoRA run's adapter into its base weights: a plain save_pretrained folder (weights,
    config, tokenizer, the agent's system prompt) that transformers and vLLM load directly."""
    from kgsynth.manifest import write_manifest
    from kgsynth.stage_io import StagedOutput
    from kgsynth.train.lora import merge

    started = time.perf_counter()
    try:
        staged = StagedOutput(out_dir, folder=True, overwrite=overwrite, inputs=[("RUN", run)])
        with staged:
            info = merge(run, staged.staging)
            write_manifest(
                staged.path("manifest.json"),
                stage="train merge",
                input={"run": str(run)},
                output={"path": str(out_dir)},
                parameters=info["parameters"],
                elapsed_s=round(time.perf_counter() - started, 3),
            )
            staged.commit()
    except KGSynthError as exc:
        fail(exc)
    out.print(f"merged {run} → {out_dir} ({info['parameters']:,} parameters)", highlight=False)
