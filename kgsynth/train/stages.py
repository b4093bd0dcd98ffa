"""The training stages as the CLI runs them: ``kgsynth train stage1|stage2|rl|merge``.

Each takes its built config, its inputs and its run folder, trains in this process or through
a launcher (:mod:`kgsynth.train.launch`), and writes the folder's ``manifest.json`` last; the
CLI only builds the config, shows progress and prints the result.

- :func:`plan` — the launcher and command a run will use (what ``--dry-run`` prints);
- :func:`run_sft` — SFT into a run folder that resumes an unfinished run of the same options;
- :func:`run_rl` — GRPO, written through :class:`kgsynth.core.stage_io.StagedOutput`;
- :func:`run_merge` — a LoRA run's adapter folded into full weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kgsynth.core.config import config_record
from kgsynth.core.errors import KGSynthError
from kgsynth.train.core import SFT_SPEC, free_port
from kgsynth.train.grpo_config import RL_SPEC
from kgsynth.train.launch import LaunchConfig, launch_command, resolve_launcher, run_launched

if TYPE_CHECKING:
    from kgsynth.agent.carried import CarriedAgent
    from kgsynth.agent.config import AgentConfig

Progress = Callable[[int, int, dict], None]


@dataclass(frozen=True)
class Plan:
    """Where the run's processes come from: ``none`` (this process) or a launch command."""

    launch: LaunchConfig
    launcher: str
    spec_path: Path

    @property
    def command(self) -> list[str]:
        if self.launcher == "none":
            return [sys.executable, "-m", "kgsynth.train.launch", str(self.spec_path)]
        return launch_command(self.spec_path, self.launch, self.launcher)


def plan(launch: LaunchConfig, deepspeed: str | None, spec_path: Path) -> Plan:
    """The launcher ``launch`` resolves to (checked), for a run whose spec is ``spec_path``."""
    launcher = resolve_launcher(launch, deepspeed is not None)
    if launch.master_port == 0 and launcher != "none":  # a free port, picked once for the run
        launch = dataclasses.replace(launch, master_port=free_port())
    return Plan(launch, launcher, spec_path)


def sft_agent(cfg: Any, carried: CarriedAgent | None) -> tuple[dict[str, Any], str] | None:
    """The agent settings an SFT run trains under, and where they came from: what its corpus's
    trajectories were made with (``carried``, :func:`kgsynth.agent.carried.sft_agent`) with the
    run's own agent options over it (stage 2's early stopping's, from its ``--config`` section
    or flags, which the CLI layered over ``carried``). None where nothing says what the corpus
    was made with: the run then carries no settings, as runs did before they were kept."""
    from kgsynth.agent.carried import SAVED_FIELDS
    from kgsynth.agent.config import AgentConfig

    if carried is None:
        return None
    # the run's options where they hold a carried setting or were given (a default of its own
    # is no setting the corpus was made with: an oracle corpus carries no turn-token cap)
    own = {
        name: getattr(cfg.agent, name)
        for name in SAVED_FIELDS
        if name in carried.values or name in carried.given
    }
    values = {**carried.values, **own}
    AgentConfig(**values)  # the settings together pass the agent's checks
    given = [n for n in own if n not in carried.values or own[n] != carried.values[n]]
    origin = carried.subject
    if given:
        origin += f"; {', '.join(given)} as the training command gave them"
    return values, origin


def sft_dry_run(
    stage: str, cfg: Any, corpus: Path, out_dir: Path, p: Plan, carried: CarriedAgent | None = None
) -> dict[str, Any]:
    """What ``--dry-run`` prints of an SFT run: the resolved configuration, the agent settings
    it trains under (None: none known) and the launch."""
    from kgsynth.train.sft import resolve_config

    trained = sft_agent(cfg, carried)
    return {
        "stage": stage,
        "corpus": str(corpus),
        "out": str(out_dir),
        "config": config_record(resolve_config(cfg, stage)),
        "agent": trained[0] if trained else None,
        "launcher": p.launcher,
        "world_size": p.launch.world_size,
    }


def run_sft(
    stage: str,
    cfg: Any,
    corpus: Path,
    out_dir: Path,
    p: Plan,
    *,
    overwrite: bool,
    config_path: Path | None,
    status: Callable[[str], AbstractContextManager[Any]] | None = None,
    progress: Callable[[], AbstractContextManager[Progress]] | None = None,
    notify: Callable[[str], None] | None = None,
    carried: CarriedAgent | None = None,
) -> dict[str, Any] | None:
    """Train an SFT stage into ``out_dir`` and write its manifest; the manifest, or None on a
    torchrun node other than rank 0's. ``status(message)`` wraps the preparation,
    ``progress()`` yields the step callback of a run in this process, ``notify`` is told the
    launch command of a launched one. ``carried``: what the corpus's trajectories were made
    with (:func:`sft_agent`); the run folder and each checkpoint carry the agent it gives
    (``agent_config.json``), and stage 2's early stopping answers with it."""
    from kgsynth.agent.carried import write_agent_file
    from kgsynth.core.stage_io import OutputLock, check_folder_target, check_overlap, recover_input
    from kgsynth.train.sft import SUMMARY, prepare_run, train_sft
    from kgsynth.train.sft_config import check_batch_split

    started = time.perf_counter()
    check_folder_target(out_dir)
    check_overlap(
        [out_dir],
        [
            ("--corpus", corpus),
            ("--init", cfg.init),
            ("--config", config_path),
            ("--select-questions", cfg.select_questions),
            ("--select-kg", cfg.select_kg),
            ("--select-cache", cfg.select_cache),
        ],
    )
    # one run per folder: a second one on it fails at once (the lock goes with the process)
    with OutputLock(out_dir), _removed_unless_progress(out_dir):
        recover_input(corpus)
        _drop_run_without_progress(out_dir)
        with (status or _quiet)("reading the corpus and preparing the run folder…"):
            spec = prepare_run(cfg, stage, corpus, out_dir, overwrite=overwrite)
        trained = sft_agent(spec.config, carried)
        if trained is not None:  # before training: the trainer copies it into each checkpoint
            write_agent_file(out_dir, *trained)
        check_batch_split(spec.config, p.launch.world_size)
        if p.launcher == "none":
            with (progress or _no_progress)() as step:
                summary = train_sft(spec, progress=step)
        else:
            if notify:
                notify(f"launching: {shlex.join(p.command)}")
            summary = run_launched(p.command, out_dir / SUMMARY)
        if summary is None:  # a torchrun node other than rank 0's
            return None
        if spec.config.select_questions:
            from kgsynth.agent.config import AgentConfig

            # the run's settings; where it carries none, its own options (as before)
            agent = AgentConfig(**trained[0]) if trained else None
            summary = _select_sft(spec, summary, notify, agent)
        return _sft_manifest(spec, p, summary, started, trained)


@contextlib.contextmanager
def _removed_unless_progress(out_dir: Path) -> Iterator[None]:
    """A run that makes ``out_dir`` and fails before any progress (a full disk, a bad option
    found late, Ctrl-C before the first checkpoint) leaves nothing behind; a folder that was
    there before keeps what it had."""
    created = not out_dir.exists()
    try:
        yield
    except BaseException:
        if created:
            _drop_run_without_progress(out_dir, spec_needed=False)
        raise


def _drop_run_without_progress(out_dir: Path, *, spec_needed: bool = True) -> None:
    """Remove an unfinished SFT run folder that holds nothing to resume from: no complete
    checkpoint, no saved weights, no manifest.

    A run that failed or was killed before its first checkpoint (a bad ``--lora-target``
    fails as training starts) leaves its ``train_config.json``; kept, it would make the
    corrected command a "different run" that only ``--overwrite`` gets past, although there is
    no progress to protect. A folder with a checkpoint or weights keeps its run: the same
    options resume it and different ones are still refused."""
    from kgsynth.train.sft_config import CHECKPOINTS
    from kgsynth.train.sft_run import last_complete_checkpoint

    if not out_dir.is_dir() or (out_dir / "manifest.json").exists():
        return  # nothing there, or a finished run
    if spec_needed and not (out_dir / SFT_SPEC).is_file():
        return  # not a kgsynth run folder (prepare_run refuses it)
    if last_complete_checkpoint(out_dir / CHECKPOINTS) is not None:
        return
    if any(out_dir.glob("*.safetensors")):  # trained to the end; only the manifest is missing
        return
    shutil.rmtree(out_dir, ignore_errors=not spec_needed)


def _select_sft(
    spec: Any,
    summary: dict[str, Any],
    notify: Callable[[str], None] | None,
    agent: AgentConfig | None = None,
) -> dict:
    """The SFT stages' early stopping: stage 2's start (the stage-1 model; stage 1 has none, its
    reference is its last weights), each ``checkpoint-N`` and the last weights, answering as
    ``agent`` (the run's; its own agent options where it carries none); the summary
    (``train_summary.json``) records the scores."""
    from kgsynth.train.sft import SUMMARY
    from kgsynth.train.sft_config import LOSS_PNG, METRICS

    run_dir = Path(spec.out)
    summary = {
        **summary,
        **_select(
            spec.config, run_dir, summary["steps"], spec.config.select_kg, None, notify,
            agent=agent, init=spec.config.init if spec.stage == "stage2" else None,
            prefix="checkpoint-",
            run_files=(METRICS, SUMMARY, LOSS_PNG, SFT_SPEC, "training_args.bin"),
        ),
    }  # fmt: skip
    (run_dir / SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary


@contextlib.contextmanager
def _quiet(message: str) -> Iterator[None]:
    yield


@contextlib.contextmanager
def _no_progress() -> Iterator[None]:
    yield None


def _sft_manifest(
    spec: Any,
    p: Plan,
    summary: dict[str, Any],
    started: float,
    trained: tuple[dict[str, Any], str] | None = None,
) -> dict[str, Any]:
    from kgsynth.core.manifest import sha256_file, write_manifest

    run_dir = Path(spec.out)
    start_from: dict[str, Any] = {"path": str(spec.model_path)}
    weights = spec.model_path / "model.safetensors"
    if weights.is_file():
        start_from["weights_sha256"] = sha256_file(weights)
    final = run_dir / "model.safetensors"
    return write_manifest(
        run_dir / "manifest.json",
        stage=f"train {spec.stage}",
        config=config_record(spec.config),
        launch={
            **dataclasses.asdict(p.launch),
            "launcher": p.launcher,
            "command": shlex.join(p.command),
        },
        input={
            "corpus": spec.corpus,
            "sha256": sha256_file(spec.corpus),
            "rows": summary["data"]["rows"],
        },
        start_from=start_from,
        # the agent settings the run trained under (agent_config.json), and whose they were
        agent={"settings": trained[0], "from": trained[1]} if trained else None,
        output={
            "path": str(run_dir),
            "weights_sha256": sha256_file(final) if final.is_file() else None,
            "bytes": sum(f.stat().st_size for f in run_dir.glob("*") if f.is_file()),
        },
        elapsed_s=round(time.perf_counter() - started, 3),
        **{k: v for k, v in summary.items() if k != "stage"},
    )


def preset_base(
    preset: str | None, config: Path | None, section: str | None = "rl", init: str | None = None
) -> dict[str, Any]:
    """The GRPOConfig options of the preset named by --preset or the config file's ``preset``
    (in its ``section``), with the agent settings of its environment that the model ``init``
    does not carry (:data:`kgsynth.train.presets.RL_PRESET_AGENT`: a model keeps the
    environment it was trained in)."""
    from kgsynth.agent.carried import model_agent
    from kgsynth.core.config import load_yaml
    from kgsynth.train.presets import preset_agent_values, preset_values

    name = preset
    if name is None and config is not None:
        name = load_yaml(config, section).get("preset")
    if name is None:
        return {}
    if not isinstance(name, str):
        raise KGSynthError(f"--config: {config}: preset must be a name (got {name!r})")
    carried = model_agent(init)
    held = carried.values if carried is not None else {}
    agent = {k: v for k, v in preset_agent_values(name).items() if k not in held}
    return {**preset_values(name), **agent}


def rl_dry_run(questions: Path, kg: str | None, cfg: Any, out_dir: Path, p: Plan) -> dict:
    """What ``--dry-run`` prints of an RL run."""
    command = p.command if p.launcher != "none" else None
    return {
        "questions": str(questions),
        "kg": kg,
        "out": str(out_dir),
        "config": config_record(cfg),
        "launcher": p.launcher,
        "world_size": p.launch.world_size,
        "command": shlex.join(command) if command else None,
    }


def run_rl(
    questions: Path,
    kg: str | None,
    profile: str | None,
    cfg: Any,
    out_dir: Path,
    p: Plan,
    *,
    overwrite: bool,
    config_path: Path | None,
    progress: Progress | None = None,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """GRPO into ``out_dir`` (staged: the folder appears whole) and its manifest; the manifest,
    or None on a torchrun node other than rank 0's. Without ``overwrite`` a killed run's
    checkpoints stay and training goes on from the last."""
    from kgsynth.core.manifest import sha256_file
    from kgsynth.core.stage_io import StagedOutput
    from kgsynth.train.grpo import SUMMARY, RLSpec, read_rl_questions, train_grpo

    started = time.perf_counter()
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
            ("--config", config_path),
            ("--phase2-questions", cfg.phase2_questions),
            ("--select-questions", cfg.select_questions),
            ("--select-cache", cfg.select_cache),
        ],
    )
    with staged:
        if kg is None:
            from kgsynth.kg.open import DEFAULT_KG

            kg = str(DEFAULT_KG)
        spec = RLSpec(str(questions), kg, profile, str(staged.staging), cfg)
        if p.launcher == "none":
            summary = train_grpo(spec, progress=progress, questions=qs)
        else:
            spec.write(staged.path(RL_SPEC))
            command = launch_command(staged.path(RL_SPEC), p.launch, p.launcher)
            if notify:
                notify(f"launching: {shlex.join(command)}")
            launched = run_launched(command, staged.staging / SUMMARY)
            if launched is None:  # a torchrun node other than rank 0's
                return None
            summary = launched
        if cfg.select_questions:
            summary.update(
                _select(
                    cfg, staged.staging, cfg.max_steps, spec.kg, spec.profile, notify,
                    init=cfg.init, batch_size=cfg.rollout_batch_size,
                )
            )  # fmt: skip
            (staged.staging / SUMMARY).write_text(json.dumps(summary, indent=2))
        manifest = staged.write_manifest(
            "train rl",
            cfg,
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
    return manifest


def _select(
    cfg: Any,
    run_dir: Path,
    steps: int,
    kg: str | None,
    profile: str | None,
    notify: Callable[[str], None] | None,
    agent: AgentConfig | None = None,
    *,
    init: str | Path | None,
    **layout: Any,
) -> dict[str, Any]:
    """Early stopping on the validation questions of ``cfg`` (GRPO's or stage 2's; their
    ``init`` is the start, :mod:`kgsynth.train.select`) on ``kg`` (None: the shipped KB),
    answered by ``agent`` (default: ``cfg.agent``); the summary fields it adds. ``init`` is
    the start (None: stage 1's fresh model, not a candidate). ``layout``: the batch size and
    the run folder's checkpoint names."""
    from kgsynth.kg.graph import KGGraph
    from kgsynth.kg.open import DEFAULT_KG, open_kg
    from kgsynth.train.select import select_weights, selection_summary

    graph = KGGraph(open_kg(kg or str(DEFAULT_KG), profile=profile))
    record = select_weights(
        run_dir, init, steps, cfg.select_questions, cfg.select_limit, graph,
        agent or cfg.agent,
        alpha=cfg.select_alpha, notify=notify, cache=cfg.select_cache, **layout,
    )  # fmt: skip
    return selection_summary(record)


def run_merge(
    run: Path, out_dir: Path, *, overwrite: bool, base_model: Path | None = None
) -> dict[str, Any]:
    """A LoRA run folder's adapter folded into its base weights (the folder the adapter names,
    or ``base_model``), into ``out_dir``; what :func:`kgsynth.train.lora.merge` reports."""
    from kgsynth.core.modelio import adapter_base, is_adapter
    from kgsynth.core.stage_io import StagedOutput
    from kgsynth.train.lora import merge

    started = time.perf_counter()
    # a base that is not here fails now, before any output is staged or any model loaded
    base = adapter_base(run, base_model) if is_adapter(run) else None
    staged = StagedOutput(
        out_dir, folder=True, overwrite=overwrite, inputs=[("RUN", run), ("--base-model", base)]
    )
    with staged:
        info = merge(run, staged.staging, base)
        staged.write_manifest(
            "train merge",
            input={"run": str(run), "base_model": base},
            output={"path": str(out_dir)},
            parameters=info["parameters"],
            elapsed_s=round(time.perf_counter() - started, 3),
        )
        staged.commit()
    return info
