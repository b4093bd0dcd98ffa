"""``kgsynth train stage1|stage2|rl|merge``: SFT, GRPO and LoRA merging of the agent policy.

One flag per field of :class:`~kgsynth.train.sft_config.SFTConfig`,
:class:`~kgsynth.train.grpo_config.GRPOConfig` and
:class:`~kgsynth.train.launch.LaunchConfig`; the stages themselves are
:mod:`kgsynth.train.stages`. A command builds its config, calls the stage, shows progress and
prints the result.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from kgsynth.agent.carried import CarriedAgent
from kgsynth.agent.config import AGENT_FIELDS
from kgsynth.cli.common import fail, progress_bar, stderr, stdout
from kgsynth.cli.fields import config_command, field_params
from kgsynth.cli.options import ConfigOption, KGOption, ProfileOption
from kgsynth.cli.panels import INPUTS, LAUNCH, MODEL, OPTIMIZATION, OUTPUT, command
from kgsynth.core.errors import KGSynthError
from kgsynth.train.grpo_config import GRPOConfig
from kgsynth.train.launch import LaunchConfig
from kgsynth.train.sft_config import SFTConfig

train_app = typer.Typer(
    help="Train the agent: stage1 and stage2 (SFT on synthetic, then expert trajectories), rl "
    "(GRPO against the live KG), merge (fold a LoRA adapter into its base weights).",
    no_args_is_help=True,
)

CorpusOption = Annotated[
    Path,
    typer.Option(
        "--corpus",
        help="Trajectory Parquet with a messages column (corpus/accepted.parquet).",
        rich_help_panel=INPUTS,
    ),
]
OutOption = Annotated[
    Path,
    typer.Option(
        "--out", help="Run folder; ends up a save_pretrained model folder.", rich_help_panel=OUTPUT
    ),
]
SFTOverwriteOption = Annotated[
    bool,
    typer.Option(
        help="Delete an earlier run in --out (a finished one, or one with other options) and "
        "train afresh; without it an unfinished run of the same options is resumed.",
        rich_help_panel=OUTPUT,
    ),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the resolved configuration and the launch command; train nothing.",
        rich_help_panel=OUTPUT,
    ),
]
# stage 2 starts from stage 1's folder: no --model and no tiny-model options
_STAGE2_SKIP = ("model", "tiny_vocab_size", "tiny_hidden_size", "tiny_layers", "tiny_heads",
                "tiny_kv_heads", "tiny_init_std")  # fmt: skip


def with_launch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One flag per :class:`LaunchConfig` field, handed to ``fn`` built, as ``launch``."""
    params = field_params(LaunchConfig, panel=LAUNCH)
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(fn, eval_str=True).parameters.values()
        if p.name != "launch"
    ]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        given = {p.name: kwargs.pop(p.name) for p in params}
        launch = LaunchConfig(**{k: v for k, v in given.items() if v is not None})
        return fn(launch=launch, **kwargs)

    command.__signature__ = inspect.Signature([*own, *params])  # type: ignore[attr-defined]
    return command


def _sft_command(stage: str, skip: tuple[str, ...], doc: str) -> Callable[..., Any]:
    """``kgsynth train stage1`` or ``stage2``: the same SFT, from --model or from --init."""

    def command(
        cfg: SFTConfig,
        launch: LaunchConfig,
        corpus: CorpusOption,
        out_dir: OutOption,
        config: ConfigOption = None,
        overwrite: SFTOverwriteOption = False,
        dry_run: DryRunOption = False,
        carried_agent: CarriedAgent | None = None,
    ) -> None:
        _sft(stage, cfg, launch, corpus, out_dir, config, overwrite, dry_run, carried_agent)

    def carried(given: dict[str, Any], params: dict[str, Any]) -> CarriedAgent | None:
        """What the corpus's trajectories were made with (stage 2: where they do not say, what
        its --init carries): the settings the run trains under, before its own options."""
        from kgsynth.agent.carried import sft_agent

        return sft_agent(params["corpus"], given.get("init") if stage == "stage2" else None)

    command.__doc__ = doc
    return config_command(SFTConfig, section=stage, skip=skip, carried=carried, panel=OPTIMIZATION)(
        with_launch(command)
    )


stage1_cmd = command(train_app, "stage1")(
    _sft_command(
        "stage1",
        ("init", *AGENT_FIELDS),
        "Stage 1 SFT: from --model (a checkpoint folder or 'tiny') on synthetic trajectories.",
    )
)
stage2_cmd = command(train_app, "stage2")(
    _sft_command(
        "stage2",
        _STAGE2_SKIP,
        "Stage 2 SFT: from stage 1's folder (--init) on expert or rejection-sampled trajectories.",
    )
)


def _notify(message: str) -> None:
    stderr.print(message, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _sft_progress(stage: str) -> Iterator[Callable[[int, int, dict], None]]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the bar below is the progress
    with progress_bar(stage, console=stderr) as bar:
        task = bar.add_task("train", total=None, info="")

        def progress(step: int, max_steps: int, logs: dict) -> None:
            bar.update(task, completed=step, total=max_steps or None)
            if "loss" in logs:
                bar.update(
                    task, info=f"loss {logs['loss']:.3f}, {logs['tokens_per_s']:,.0f} tokens/s"
                )

        yield progress


def _sft(
    stage: str,
    cfg: SFTConfig,
    launch: LaunchConfig,
    corpus: Path,
    out_dir: Path,
    config: Path | None,
    overwrite: bool,
    dry_run: bool,
    carried: CarriedAgent | None = None,
) -> None:
    from kgsynth.train import stages
    from kgsynth.train.sft_config import SPEC

    try:
        plan = stages.plan(launch, cfg.deepspeed, out_dir / SPEC)
        if dry_run:
            stdout.print_json(data=stages.sft_dry_run(stage, cfg, corpus, out_dir, plan, carried))
            where = "in this process, equivalent to" if plan.launcher == "none" else "command"
            stdout.print(f"# {where}:\n{shlex.join(plan.command)}", highlight=False, soft_wrap=True)
            return
        manifest = stages.run_sft(
            stage, cfg, corpus, out_dir, plan, overwrite=overwrite, config_path=config,
            status=stderr.status, progress=lambda: _sft_progress(stage), notify=_notify,
            carried=carried,
        )  # fmt: skip
    except KGSynthError as exc:
        fail(exc)
    if manifest is None:  # a torchrun node other than rank 0's
        return
    loss_a, loss_b = manifest["loss_first"], manifest["loss_last"]
    data = manifest["data"]
    stdout.print(
        f"{stage}: {manifest['steps']} steps ({manifest['epochs_done']:.2f} epochs) "
        f"in {manifest['wall_s']:.1f}s, loss {loss_a:.3f} → {loss_b:.3f}, "
        f"{manifest['tokens_per_s']:,.0f} tokens/s, non-padding {manifest['nonpad_fraction']:.0%}; "
        f"{data['samples']:,} of {data['rows']:,} trajectories "
        f"({data['dropped_overlong']} over-long dropped) → {out_dir}",
        highlight=False,
    )
    _print_selection(stage, manifest)


def _print_selection(stage: str, manifest: dict[str, Any]) -> None:
    """Which weights early stopping (--select-questions) kept, and why."""
    sel = manifest.get("selection")
    if not sel:
        return
    last = sel["scores"][-1]["hits_at_1"]  # in step order: the last weights come last
    ref_step = sel.get("reference_step", 0)  # stage 1 compares with its last weights
    ref_name = "last weights" if ref_step else "start"
    best = next(s for s in sel["scores"] if s["step"] == sel["best_step"])
    why = ""
    if best["step"] != sel["chosen_step"]:
        why = (
            f"; the best, step {best['step']} at {best['hits_at_1']:.3f}, was "
            f"{best['better']} better and {best['worse']} worse than the {ref_name}: sign test "
            f"p {best['sign_test_p']:.3f}, not below {sel['alpha']}"
        )
    start = "" if ref_step else f"start {sel['scores'][0]['hits_at_1']:.3f}, "
    stdout.print(
        f"{stage}: kept the weights of step {sel['chosen_step']} (validation Hits@1 "
        f"{sel['chosen_hits_at_1']:.3f} on {sel['evaluated']} questions; "
        f"{start}last step {last:.3f}{why})",
        highlight=False,
    )


def _preset_layer(given: dict[str, Any], config: Path | None, section: str | None) -> dict:
    from kgsynth.train.stages import preset_base

    return preset_base(given["preset"], config, section, init=given.get("init"))


def _init_carries(given: dict[str, Any], params: dict[str, Any]) -> CarriedAgent | None:
    """RL rolls out in the tool environment its --init was trained in, unless told otherwise;
    another tool set (a --preset's, --toolset's) only with --allow-toolset-change."""
    from kgsynth.agent.carried import check_toolset_change, model_agent
    from kgsynth.train.presets import preset_values

    agent = model_agent(given.get("init"))
    preset = given.get("preset")
    by_preset = preset and preset_values(preset).get("toolset") == given.get("toolset")
    check_toolset_change(
        agent, given, f"--preset {preset} sets" if by_preset else "--toolset (or --config) sets"
    )
    _note_preset_agent(agent, preset)
    return agent


def _note_preset_agent(agent: CarriedAgent | None, preset: str | None) -> None:
    """One line for each agent setting of the preset that the model carries otherwise: the
    model's value is kept (it was trained in that environment)."""
    from kgsynth.train.presets import preset_agent_values

    carried = agent.values if agent is not None else {}
    for name, value in preset_agent_values(preset).items():
        if name in carried and carried[name] != value:
            stderr.print(
                f"note: the model carries {name} {carried[name]!r}; --preset {preset}'s "
                f"{value!r} is not applied (train with it from the start to use it)"
            )


@command(train_app, "rl")
@config_command(
    GRPOConfig, section="rl", base=_preset_layer, carried=_init_carries, panel=OPTIMIZATION
)
@with_launch
def rl_cmd(
    cfg: GRPOConfig,
    launch: LaunchConfig,
    questions: Annotated[
        Path,
        typer.Option(
            help="Questions with topic entities and gold answers: questions.parquet from "
            "`synthesize questions`, MetaQA txt or JSONL.",
            rich_help_panel=INPUTS,
        ),
    ],
    out_dir: OutOption,
    init: Annotated[
        str,
        typer.Option(
            help="The SFT output folder to start from (stage2, or stage1).", rich_help_panel=MODEL
        ),
    ],
    kg: KGOption = None,
    profile: ProfileOption = None,
    config: ConfigOption = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace an earlier run in --out (a folder kgsynth wrote).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the resolved configuration; train nothing.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
) -> None:
    """GRPO against the live KG: multi-turn rollouts with the KG tools, the seeds' rewards.
    With --nproc-per-node N, N processes (torchrun, or the deepspeed launcher with
    --deepspeed) each roll out whole groups of the step's questions and step together."""
    from kgsynth.train import stages
    from kgsynth.train.grpo_config import resolve_config

    try:
        cfg = resolve_config(cfg)
        plan = stages.plan(launch, cfg.deepspeed, out_dir / stages.RL_SPEC)
        if dry_run:
            stdout.print_json(data=stages.rl_dry_run(questions, kg, cfg, out_dir, plan))
            return
        with progress_bar("rl", console=stderr) as bar:
            task = bar.add_task("rl", total=cfg.max_steps, info="")

            def progress(step: int, total: int, row: dict) -> None:
                bar.update(task, completed=step, info=f"reward {row['reward']:.3f}, kl "
                           f"{row['kl']:.4f}, {row['step_s']:.1f}s/step, skipped "
                           f"{row['skipped_groups']}/{row['groups']}")  # fmt: skip

            manifest = stages.run_rl(
                questions, kg, profile, cfg, out_dir, plan, overwrite=overwrite,
                config_path=config, progress=progress, notify=_notify,
            )  # fmt: skip
    except KGSynthError as exc:
        fail(exc)
    if manifest is None:  # a torchrun node other than rank 0's
        return
    stdout.print(
        f"rl: {manifest['steps']} steps in {manifest['wall_s']:.1f}s, reward "
        f"{manifest['reward_first']:.3f} → {manifest['reward_last']:.3f} (first/last fifth), "
        f"{manifest['mean_step_s']:.1f}s/step ({manifest['mean_rollout_s']:.1f}s of it rollouts), "
        f"{manifest['mean_rollout_tokens_per_s']:,.0f} rollout "
        f"tokens/s, {manifest['skipped_groups']} of {manifest['groups']} groups skipped "
        f"(equal rewards) → {out_dir}",
        highlight=False,
    )
    _print_selection("rl", manifest)


@command(train_app, "merge")
def merge_cmd(
    run: Annotated[Path, typer.Argument(help="A LoRA run folder (stage1, stage2 or rl).")],
    out_dir: Annotated[
        Path,
        typer.Option("--out", help="Folder for the merged full model.", rich_help_panel=OUTPUT),
    ],
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace an earlier merge in --out (a folder kgsynth wrote).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    base_model: Annotated[
        Path | None,
        typer.Option(
            help="The model folder the adapter was trained from, where it is no longer where "
            "the adapter says (a run folder moved without its base). \\[default: the folder "
            "adapter_config.json names, found relative to RUN first]",
            rich_help_panel=MODEL,
        ),
    ] = None,
) -> None:
    """Fold a LoRA run's adapter into its base weights: a plain save_pretrained folder (weights,
    config, tokenizer, the agent's system prompt and settings) that transformers and vLLM load
    directly."""
    from kgsynth.train.stages import run_merge

    try:
        info = run_merge(run, out_dir, overwrite=overwrite, base_model=base_model)
    except KGSynthError as exc:
        fail(exc)
    stdout.print(f"merged {run} → {out_dir} ({info['parameters']:,} parameters)", highlight=False)
