"""Domain exceptions. Only the CLI turns them into one-line messages and exit codes."""

from __future__ import annotations


class KGSynthError(Exception):
    """Base class for every error kgsynth reports to a user."""

    exit_code = 1


class ConfigError(KGSynthError):
    """A bad option or configuration value; the message names the field and the valid range."""

    exit_code = 2


class InputFileError(KGSynthError):
    """A malformed input file; the message names the file and line/row."""

    exit_code = 3

    def __init__(self, path: object, message: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.message = message
        self.line = line

    def __reduce__(self) -> tuple[type, tuple[object, str, int | None]]:
        # rebuilt from its parts (an import's conversion raises it in a child process)
        return (type(self), (self.path, self.message, self.line))


class KGError(KGSynthError):
    """The knowledge graph could not answer."""

    exit_code = 4


class KGUnavailableError(KGError):
    """A SPARQL endpoint stayed down after the bounded retries."""


class KGTimeoutError(KGError):
    """A query ran past its timeout."""


class KGMemoryError(KGError):
    """A query needed more memory than its limit (an agent's query, run in a child process
    with a memory limit) and was stopped."""


class QueryRejectedError(KGError):
    """A query that is not read-only (an UPDATE) or does not parse."""


class LLMFailuresError(KGSynthError):
    """Too many LLM requests failed (after retries); what succeeded was written."""

    exit_code = 5


class QueryRefusedError(QueryRejectedError):
    """The read-only guard refused a query: not a single SELECT/ASK/CONSTRUCT/DESCRIBE query,
    an update, SERVICE, or text that does not parse (:mod:`kgsynth.kg.guard`)."""


class RowLimitError(KGError):
    """A query returned more rows than its row cap (``max_rows``)."""


class OutputBusyError(KGSynthError):
    """Another kgsynth run holds the lock on this output (:mod:`kgsynth.core.stage_io`)."""

    exit_code = 6
