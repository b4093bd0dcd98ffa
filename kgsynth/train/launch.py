"""Multi-process launch of an SFT or GRPO run: the ``deepspeed`` launcher or ``torchrun``.

``kgsynth train stage1|stage2`` writes the resolved run to ``OUT/train_config.json`` and, for
more than one process, runs one of::

    deepspeed --num_gpus N --num_nodes M --master_addr A --master_port P [--hostfile H] \\
        --module kgsynth.train.launch OUT/train_config.json
    torchrun --nproc_per_node N --nnodes M --node_rank R --master_addr A --master_port P \\
        -m kgsynth.train.launch OUT/train_config.json

(``--dry-run`` prints it). With the deepspeed launcher a multi-node run starts once, on the
first node, from a hostfile (ssh/pdsh reaches the others); with torchrun the same command runs
on every node with its own ``--node-rank``. One process (the default) trains in the calling
process, on CPU through the gloo backend when there is no GPU.

``python -m kgsynth.train.launch SPEC`` is the worker every launched process runs: it reads
the spec and calls :func:`kgsynth.train.sft.train_sft`; rank 0 writes ``train_summary.json``,
from which the CLI writes the manifest once the launcher returns.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError

LAUNCHERS = ("auto", "none", "torchrun", "deepspeed")


@dataclass(frozen=True)
class LaunchConfig:
    """How many processes, where, and through which launcher."""

    nproc_per_node: int = option(1, "Processes (GPUs) per node; > 1 starts a launcher.")
    nnodes: int = option(1, "Nodes.", advanced=True)
    node_rank: int = option(0, "This node's rank (torchrun).", advanced=True)
    master_addr: str = option("127.0.0.1", "Address of the rank-0 node.", advanced=True)
    master_port: int = option(
        29500,
        "Port of the rank-0 node; 0: a free port of this machine (one node only).",
        advanced=True,
    )
    launcher: str = option(
        "auto",
        "auto (none for one process, deepspeed with --deepspeed, else torchrun), none, torchrun "
        "or deepspeed.",
    )
    hostfile: str | None = option(
        None, "DeepSpeed hostfile for a multi-node deepspeed launch.", advanced=True
    )

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def resolve_launcher(launch: LaunchConfig, deepspeed: bool) -> str:
    """The launcher to use (``none``: train in this process); checks the combination."""
    for name, value, low in (
        ("nproc_per_node", launch.nproc_per_node, 1),
        ("nnodes", launch.nnodes, 1),
        ("master_port", launch.master_port, 0),
    ):
        if value < low:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= {low} (got {value})")
    if not 0 <= launch.node_rank < launch.nnodes:
        raise ConfigError(
            f"--node-rank must be in [0, {launch.nnodes - 1}] (got {launch.node_rank})"
        )
    if launch.master_port == 0 and launch.nnodes > 1:
        raise ConfigError("--master-port 0 (a free port) is for one node; name the port")
    if launch.launcher not in LAUNCHERS:
        raise ConfigError(
            f"--launcher must be one of {', '.join(LAUNCHERS)} (got {launch.launcher!r})"
        )
    launcher = launch.launcher
    if launcher == "auto":
        launcher = "none" if launch.world_size == 1 else ("deepspeed" if deepspeed else "torchrun")
    if launcher == "none" and launch.world_size > 1:
        raise ConfigError("--launcher none trains in one process; use --nproc-per-node 1")
    if launcher == "deepspeed" and launch.nnodes > 1 and not launch.hostfile:
        raise ConfigError(
            "--launcher deepspeed with --nnodes > 1 needs --hostfile (or use --launcher torchrun "
            "and run the command on every node with its --node-rank)"
        )
    if launch.hostfile and not Path(launch.hostfile).is_file():
        raise ConfigError(f"--hostfile: {launch.hostfile} does not exist")
    return launcher


def _tool(name: str) -> str:
    """A console script next to this interpreter (the virtualenv's), else on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def launch_command(spec_path: str | Path, launch: LaunchConfig, launcher: str) -> list[str]:
    """The command that starts every process of the run (``launcher`` from
    :func:`resolve_launcher`, not ``none``)."""
    spec = str(spec_path)
    if launcher == "deepspeed":
        cmd = [
            _tool("deepspeed"),
            "--num_gpus",
            str(launch.nproc_per_node),
            "--num_nodes",
            str(launch.nnodes),
            "--master_addr",
            launch.master_addr,
            "--master_port",
            str(launch.master_port),
        ]
        if launch.hostfile:
            cmd += ["--hostfile", launch.hostfile]
        return [*cmd, "--module", "kgsynth.train.launch", spec]
    if launcher == "torchrun":
        return [
            _tool("torchrun"),
            "--nproc_per_node",
            str(launch.nproc_per_node),
            "--nnodes",
            str(launch.nnodes),
            "--node_rank",
            str(launch.node_rank),
            "--master_addr",
            launch.master_addr,
            "--master_port",
            str(launch.master_port),
            "-m",
            "kgsynth.train.launch",
            spec,
        ]
    raise ConfigError(f"no launch command for launcher {launcher!r}")


def launch_environment(command: list[str]) -> dict[str, str]:
    """The launcher's environment: this process's (quiet or ``-v``: :mod:`kgsynth.core.quiet`,
    which the workers read). Quiet, a ``deepspeed`` launch also names the accelerator
    DeepSpeed detects here (``DS_ACCELERATOR``): the launcher is DeepSpeed's own process, and
    detecting it there warns "Setting accelerator to CPU" on a machine without a GPU; told
    the same accelerator, it says nothing."""
    from kgsynth.core.quiet import verbose_from_environment

    env = dict(os.environ)
    quiet = not verbose_from_environment()
    if quiet and Path(command[0]).name == "deepspeed" and "DS_ACCELERATOR" not in env:
        from deepspeed.accelerator import get_accelerator  # quiet here: core.quiet

        env["DS_ACCELERATOR"] = get_accelerator().device_name()
    return env


def quiet_command(command: list[str]) -> list[str]:
    """``command``, with ``--log_level error`` for a ``deepspeed`` launcher unless ``-v``: its
    runner and per-node launcher log every step of starting the processes at INFO. DeepSpeed
    0.18 has the option; an older one is launched as it was."""
    import re
    from importlib.metadata import version

    from kgsynth.core.quiet import verbose_from_environment

    if Path(command[0]).name != "deepspeed" or verbose_from_environment():
        return command
    major_minor = re.match(r"(\d+)\.(\d+)", version("deepspeed"))
    if major_minor is None or (int(major_minor[1]), int(major_minor[2])) < (0, 18):
        return command
    return [command[0], "--log_level", "error", *command[1:]]


def run_launched(command: list[str], summary_path: Path) -> dict[str, Any] | None:
    """Run a launch command to its end; the summary rank 0 wrote (None on a torchrun node
    other than rank 0's, which writes none)."""
    import json
    import subprocess

    from kgsynth.core.errors import KGSynthError

    summary_path.unlink(missing_ok=True)
    try:
        env = launch_environment(command)
        rc = subprocess.run(quiet_command(command), check=False, env=env).returncode
    except OSError as exc:
        raise KGSynthError(f"cannot start {command[0]}: {exc.strerror}") from None
    if rc != 0:
        raise KGSynthError(f"{Path(command[0]).name} exited with status {rc}; see its output above")
    if not summary_path.is_file():
        return None
    return json.loads(summary_path.read_text())


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: train one process of a launched run (SFT, or GRPO for a spec whose
    ``kind`` is ``rl``)."""
    import faulthandler
    import json
    import logging

    from kgsynth.core.quiet import configure_output, verbose_from_environment

    # before the libraries are imported: quiet unless the kgsynth command that launched this
    # worker had -v (the launcher passes the environment on)
    configure_output(verbose_from_environment())

    from kgsynth.core.errors import KGSynthError
    from kgsynth.train.sft import RunSpec, train_sft

    parser = argparse.ArgumentParser(prog="python -m kgsynth.train.launch")
    parser.add_argument(
        "spec", help="OUT/train_config.json or OUT/rl_spec.json written by `kgsynth train`"
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)  # deepspeed's
    ns = parser.parse_args(argv)
    faulthandler.enable()  # a native abort prints every thread's Python stack first
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if json.loads(Path(ns.spec).read_text()).get("kind") == "rl":
            from kgsynth.train.grpo import RLSpec, train_grpo

            train_grpo(RLSpec.read(ns.spec))
        else:
            # -v: transformers' own bar and loss lines; else a line per tenth of the run
            progress = None if verbose_from_environment() else tenths_progress()
            train_sft(RunSpec.read(ns.spec), progress=progress)
    except KGSynthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def tenths_progress() -> Callable[[int, int, dict], None]:
    """A launched SFT run's progress without a terminal bar (the launcher interleaves every
    process's output): rank 0 prints one line when the run passes each tenth of its steps, with
    the latest logged loss."""
    state: dict[str, Any] = {"shown": 0, "loss": None}

    def progress(step: int, max_steps: int, logs: dict) -> None:
        if "loss" in logs:
            state["loss"] = logs["loss"]
        tenth = step * 10 // max(max_steps, 1)
        if tenth > state["shown"]:  # the last step's line once (the run's end logs it again)
            state["shown"] = tenth
            loss = "" if state["loss"] is None else f", loss {state['loss']:.4f}"
            print(f"step {step}/{max_steps}{loss}", flush=True)

    return progress


def leave(code: int) -> None:
    """End a launched worker at once, without the interpreter's teardown.

    Under load a gloo rank now and then aborted at interpreter exit ("terminate called without
    an active exception", SIGABRT) after its run had ended and every file was written; the
    launcher then reports the whole run failed. Native threads are torn down at that point in
    no fixed order. A worker has nothing left to do once :func:`main` returns (outputs closed,
    process group left), so it flushes its streams and logs and exits with ``os._exit``."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
