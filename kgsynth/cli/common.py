"""What every command shares: the two consoles, one-line failures with exit codes, count
and fraction checks, the progress bar and opening ``--kg``. A leaf: it imports no command."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from kgsynth.core.errors import KGSynthError

if TYPE_CHECKING:
    from rich.progress import Progress

stdout = Console()
stderr = Console(stderr=True)


def fail(exc: KGSynthError) -> NoReturn:
    """Print ``exc`` as one line (secrets redacted) and exit with its code."""
    fail_line(str(exc), exc.exit_code)


def fail_line(message: str, code: int) -> NoReturn:
    """Print ``message`` as the one ``error:`` line (secrets redacted) and exit with ``code``."""
    from rich.markup import escape

    from kgsynth.core.text import clean_text, redact_text

    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    message = escape(redact_text(clean_text(message)))
    stderr.print(f"[red]error:[/red] {message}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


def os_error_line(exc: OSError) -> str:
    """An operating-system error as one line naming the file: the disk full, a permission."""
    import errno

    where = exc.filename if exc.filename is not None else ""
    if exc.errno == errno.ENOSPC:
        what = "no space left on the disk; free some and run again (outputs are as they were)"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        what = "permission denied"
    elif exc.errno == errno.EROFS:
        what = "a read-only file system"
    else:
        what = exc.strerror or str(exc)
    return f"{where}: {what}" if where else what


def check_count(flag: str, value: int | None, minimum: int = 1) -> None:
    """A count option below ``minimum`` is a :class:`ConfigError` naming the flag."""
    if value is not None and value < minimum:
        from kgsynth.core.errors import ConfigError

        raise ConfigError(f"{flag} must be >= {minimum} (got {value})")


def check_fraction(flag: str, value: float) -> None:
    """A fraction outside [0, 1] (or NaN) is a :class:`ConfigError` naming the flag."""
    if not 0.0 <= value <= 1.0:
        from kgsynth.core.errors import ConfigError

        raise ConfigError(f"{flag} must be within [0, 1] (got {value})")


def check_llm_failures(
    client, max_failed_fraction: float, written: Path, stage: str = "this stage"
) -> None:
    """Raise :class:`LLMFailuresError` when every one of the stage's LLM requests failed (at
    any ``max_failed_fraction``: a run that made nothing is no success), or more than
    ``max_failed_fraction`` of them did; called after the outputs and manifest were written,
    which stay for inspection."""
    from kgsynth.core.errors import LLMFailuresError

    st = client.stats
    if st.requests and st.errors == st.requests:
        raise LLMFailuresError(
            f"{stage}: all {st.errors} of {st.requests} LLM requests failed "
            f"({client.failure_note()}), an error at any --max-failed-fraction; what was "
            f"written is kept in {written} for inspection; check --base-url, --model and "
            "--api-key"
        )
    if st.requests and st.errors / st.requests > max_failed_fraction:
        raise LLMFailuresError(
            f"{st.errors} of {st.requests} LLM requests failed "
            f"({st.errors / st.requests:.0%} > --max-failed-fraction {max_failed_fraction}); "
            f"what succeeded is in {written} (its manifest counts them under llm.stats.errors); "
            "check --base-url, --model and --api-key"
        )


def progress_bar(
    title: str = "{task.description}", *, console: Console = stderr, count: bool = True
) -> Progress:
    """The commands' progress bar: bold title, bar, done/total (unless ``count`` is off, for
    work of unknown size), the task's ``info`` field and the elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns: list[Any] = [TextColumn(f"[bold]{title}"), BarColumn()]
    if count:
        columns.append(MofNCompleteColumn())
    columns += [TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    return Progress(*columns, console=console)


def model_carries(given: dict[str, Any], params: dict[str, Any]) -> Any:
    """The agent settings a local checkpoint (``--llm hf --model DIR``) was trained with, for
    ``config_command(carried=...)``: eval and rollouts of it start from them. An API model
    (``--llm openai``) or a folder without them carries none."""
    if params.get("llm") != "hf" or not params.get("model"):
        return None
    from kgsynth.agent.carried import model_agent

    return model_agent(params["model"])


def open_kg_option(kg: str | None, profile: str | None, timeout: float = 30.0, **bounds: Any):
    """The KG named by ``--kg``/``--profile`` (the shipped default without ``--kg``)."""
    from kgsynth.kg import open_kg

    with stderr.status("opening the KG (a triple file is imported on first use)…"):
        return open_kg(kg, profile=profile, timeout=timeout, **bounds)


def open_graph_option(kg: str | None, profile: str | None):
    """:func:`open_kg_option` wrapped in the cached entity/relation access the tools use."""
    from kgsynth.kg.graph import KGGraph

    return KGGraph(open_kg_option(kg, profile))


def make_stage_llm(
    llm: str,
    out_path: Path,
    *,
    cache: Path | None,
    no_cache: bool,
    **options,
):
    """The stage's LLM, wrapped in the request cache (``llm_cache.sqlite`` beside ``--out``
    unless ``--cache`` names another or ``--no-cache``)."""
    from kgsynth.llm import make_llm

    cache_path = None if no_cache else (cache or out_path.with_name("llm_cache.sqlite"))
    return make_llm(llm, cache=cache_path, **options)
