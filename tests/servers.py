"""Real SPARQL servers for tests, and the tiny fixture KG they serve.

Plain context managers (no pytest needed), so a benchmark or a shell session can use them too::

    from tests.servers import start_oxigraph, write_fixture_nt

    nt = write_fixture_nt(Path("/tmp/kg.nt"))
    with start_oxigraph(nt, Path("/tmp/oxi")) as server:
        print(server.url)  # http://127.0.0.1:PORT/query

- :func:`start_oxigraph` runs the PyPI ``oxigraph`` server (``load`` then ``serve-read-only``).
- :func:`start_virtuoso` runs Debian's Virtuoso 7.2 (``virtuoso-t``) with its own ini, database
  and ports in a work directory, and bulk-loads the file into one named graph; Virtuoso's
  ``/sparql`` answers queries without ``FROM`` over the union of all graphs, which the start-up
  checks before handing the URL out.

Every server binds 127.0.0.1 on a free port and is stopped by its own pid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyoxigraph as ox

log = logging.getLogger(__name__)

# --- the fixture KG ------------------------------------------------------------------------

ENTITY = "http://kgsynth.org/entity/"
RELATION = "http://kgsynth.org/relation/"
RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"
OWL_SAME_AS = "http://www.w3.org/2002/07/owl#sameAs"
XSD_INTEGER = "http://www.w3.org/2001/XMLSchema#integer"
FIXTURE_GRAPH = "http://kgsynth.test/graph"

# Names as Python strings (what a caller passes to resolve), next to the escaped N-Triples below.
NAME_QUOTES = 'Tom "Tiger" O\'Neil'
NAME_BACKSLASH = "back\\slash"  # one backslash
NAME_FRENCH = "Le Fabuleux Destin d'Amélie Poulain"  # @fr: not a name in the generic profile

# A few films and people in the generic profile, written by hand (not by kgsynth's own
# escaper, so the backends are tested against independent input):
# - "Kismet" names two films; Kismet_1955 has more facts and the larger IRI, so picking by
#   degree and picking by smallest IRI disagree;
# - "Amélie", "Ōkami": non-ASCII names (also looked up in other case / NFD form);
# - Tom "Tiger" O'Neil and back\slash: quotes, an apostrophe and a backslash;
# - influenced_by runs both into and out of Tom; Paris has no label; Amélie also has a
#   French label; The Matrix has an owl:sameAs (hidden in the generic profile); years are
#   xsd:integer literals (Virtuoso's "typed-literal").
FIXTURE_NT = r"""<http://kgsynth.org/entity/Amelie> <http://www.w3.org/2000/01/rdf-schema#label> "Amélie" .
<http://kgsynth.org/entity/Amelie> <http://www.w3.org/2000/01/rdf-schema#label> "Le Fabuleux Destin d'Amélie Poulain"@fr .
<http://kgsynth.org/entity/Amelie> <http://kgsynth.org/relation/directed_by> <http://kgsynth.org/entity/Jean-Pierre_Jeunet> .
<http://kgsynth.org/entity/Amelie> <http://kgsynth.org/relation/starred_actors> <http://kgsynth.org/entity/Audrey_Tautou> .
<http://kgsynth.org/entity/Amelie> <http://kgsynth.org/relation/release_year> "2001"^^<http://www.w3.org/2001/XMLSchema#integer> .
<http://kgsynth.org/entity/Amelie> <http://kgsynth.org/relation/filmed_in> <http://kgsynth.org/entity/Paris> .
<http://kgsynth.org/entity/Jean-Pierre_Jeunet> <http://www.w3.org/2000/01/rdf-schema#label> "Jean-Pierre Jeunet" .
<http://kgsynth.org/entity/Audrey_Tautou> <http://www.w3.org/2000/01/rdf-schema#label> "Audrey Tautou" .
<http://kgsynth.org/entity/Okami> <http://www.w3.org/2000/01/rdf-schema#label> "Ōkami" .
<http://kgsynth.org/entity/Okami> <http://kgsynth.org/relation/directed_by> <http://kgsynth.org/entity/Hideki_Kamiya> .
<http://kgsynth.org/entity/Hideki_Kamiya> <http://www.w3.org/2000/01/rdf-schema#label> "Hideki Kamiya" .
<http://kgsynth.org/entity/The_Matrix> <http://www.w3.org/2000/01/rdf-schema#label> "The Matrix" .
<http://kgsynth.org/entity/The_Matrix> <http://kgsynth.org/relation/directed_by> <http://kgsynth.org/entity/Lana_Wachowski> .
<http://kgsynth.org/entity/The_Matrix> <http://kgsynth.org/relation/starred_actors> <http://kgsynth.org/entity/Keanu_Reeves> .
<http://kgsynth.org/entity/The_Matrix> <http://kgsynth.org/relation/starred_actors> <http://kgsynth.org/entity/Tom_ONeil> .
<http://kgsynth.org/entity/The_Matrix> <http://kgsynth.org/relation/release_year> "1999"^^<http://www.w3.org/2001/XMLSchema#integer> .
<http://kgsynth.org/entity/The_Matrix> <http://www.w3.org/2002/07/owl#sameAs> <http://example.org/film/matrix> .
<http://kgsynth.org/entity/Lana_Wachowski> <http://www.w3.org/2000/01/rdf-schema#label> "Lana Wachowski" .
<http://kgsynth.org/entity/Keanu_Reeves> <http://www.w3.org/2000/01/rdf-schema#label> "Keanu Reeves" .
<http://kgsynth.org/entity/Keanu_Reeves> <http://kgsynth.org/relation/influenced_by> <http://kgsynth.org/entity/Tom_ONeil> .
<http://kgsynth.org/entity/Tom_ONeil> <http://www.w3.org/2000/01/rdf-schema#label> "Tom \"Tiger\" O'Neil" .
<http://kgsynth.org/entity/Tom_ONeil> <http://kgsynth.org/relation/influenced_by> <http://kgsynth.org/entity/Back_Slash> .
<http://kgsynth.org/entity/Back_Slash> <http://www.w3.org/2000/01/rdf-schema#label> "back\\slash" .
<http://kgsynth.org/entity/Kismet_1944> <http://www.w3.org/2000/01/rdf-schema#label> "Kismet" .
<http://kgsynth.org/entity/Kismet_1944> <http://kgsynth.org/relation/directed_by> <http://kgsynth.org/entity/William_Dieterle> .
<http://kgsynth.org/entity/William_Dieterle> <http://www.w3.org/2000/01/rdf-schema#label> "William Dieterle" .
<http://kgsynth.org/entity/Kismet_1955> <http://www.w3.org/2000/01/rdf-schema#label> "Kismet" .
<http://kgsynth.org/entity/Kismet_1955> <http://kgsynth.org/relation/directed_by> <http://kgsynth.org/entity/Vincente_Minnelli> .
<http://kgsynth.org/entity/Kismet_1955> <http://kgsynth.org/relation/starred_actors> <http://kgsynth.org/entity/Howard_Keel> .
<http://kgsynth.org/entity/Kismet_1955> <http://kgsynth.org/relation/release_year> "1955"^^<http://www.w3.org/2001/XMLSchema#integer> .
<http://kgsynth.org/entity/Kismet_1955> <http://kgsynth.org/relation/has_genre> <http://kgsynth.org/entity/Musical> .
<http://kgsynth.org/entity/Vincente_Minnelli> <http://www.w3.org/2000/01/rdf-schema#label> "Vincente Minnelli" .
<http://kgsynth.org/entity/Howard_Keel> <http://www.w3.org/2000/01/rdf-schema#label> "Howard Keel" .
<http://kgsynth.org/entity/Musical> <http://www.w3.org/2000/01/rdf-schema#label> "Musical" .
"""


def write_fixture_nt(path: Path) -> Path:
    """Write :data:`FIXTURE_NT` to ``path`` (UTF-8) and return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FIXTURE_NT, encoding="utf-8")
    return path


def count_triples(nt_path: Path) -> int:
    """Distinct triples in an N-Triples file (what a store holds after loading it)."""
    return len(set(ox.parse(path=str(nt_path), format=ox.RdfFormat.N_TRIPLES)))


# --- shared helpers ------------------------------------------------------------------------


@dataclass(frozen=True)
class SparqlServer:
    """A running server: its query URL, pid, and how long start (+ load) took."""

    url: str
    pid: int
    startup_s: float
    workdir: Path


class ServerStartError(RuntimeError):
    """A test server did not come up; the message carries its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return text[-limit:] or "(empty log)"


def sparql_json(url: str, query: str, timeout: float = 5.0) -> dict:
    """POST ``query`` to ``url`` and return the parsed SPARQL-JSON result (urllib only)."""
    body = urllib.parse.urlencode({"query": query}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        headers={
            "Accept": "application/sparql-results+json",
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _wait_for_sparql(url: str, proc: subprocess.Popen, log_path: Path, deadline: float) -> None:
    """Poll ``url`` with ``ASK {}`` until it answers, the process dies, or ``deadline`` passes."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(
                f"{proc.args[0]} exited with {proc.returncode} before {url} answered; "
                f"log:\n{_tail(log_path)}"
            )
        try:
            if "boolean" in sparql_json(url, "ASK {}", timeout=2.0):
                return
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.05)
    raise ServerStartError(
        f"{url} did not answer in time (last error: {last}); log:\n{_tail(log_path)}"
    )


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop one process we started: terminate, wait, then kill if it ignores SIGTERM."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("pid %d ignored SIGTERM for %.0fs; killing it", proc.pid, timeout)
        proc.kill()
        proc.wait(timeout=timeout)


# --- Oxigraph ------------------------------------------------------------------------------


def oxigraph_executable() -> str | None:
    """The ``oxigraph`` CLI: next to this interpreter (the venv's bin) first, else on PATH."""
    beside = Path(sys.executable).parent / "oxigraph"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("oxigraph")


@contextlib.contextmanager
def start_oxigraph(
    nt_path: Path, workdir: Path, *, start_timeout: float = 30.0
) -> Iterator[SparqlServer]:
    """Load ``nt_path`` into an Oxigraph store in ``workdir`` and serve it read-only.

    Yields a :class:`SparqlServer` whose ``url`` is ``http://127.0.0.1:PORT/query``.
    """
    exe = oxigraph_executable()
    if exe is None:
        raise ServerStartError("the oxigraph executable was not found (pip install oxigraph)")
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / "store"
    log_path = workdir / "oxigraph.log"
    load = subprocess.run(
        [exe, "load", "--location", str(store), "--file", str(nt_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if load.returncode != 0:
        raise ServerStartError(f"oxigraph load failed ({load.returncode}):\n{load.stderr[-4000:]}")
    port = free_port()
    url = f"http://127.0.0.1:{port}/query"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [exe, "serve-read-only", "--location", str(store), "--bind", f"127.0.0.1:{port}"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_for_sparql(url, proc, log_path, time.monotonic() + start_timeout)
        server = SparqlServer(url, proc.pid, time.monotonic() - started, workdir)
        log.info("oxigraph pid %d serving %s (%.2fs)", proc.pid, url, server.startup_s)
        yield server
    finally:
        stop_process(proc)


# --- Virtuoso ------------------------------------------------------------------------------

VIRTUOSO_BIN = "virtuoso-t"
ISQL_BIN = "isql-vt"


def virtuoso_missing_reason() -> str | None:
    """Why Virtuoso cannot be started here, or None when it can."""
    for name in (VIRTUOSO_BIN, ISQL_BIN):
        if shutil.which(name) is None and not Path("/usr/bin", name).is_file():
            return f"{name} not found: install Debian's virtuoso-opensource to run Virtuoso tests"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/bin", name))


VIRTUOSO_INI = """\
; Written by tests/servers.py: a throwaway Virtuoso with its own files and ports.
[Database]
DatabaseFile       = {dir}/virtuoso.db
ErrorLogFile       = {dir}/virtuoso.log
LockFile           = {dir}/virtuoso.lck
TransactionFile    = {dir}/virtuoso.trx
xa_persistent_file = {dir}/virtuoso.pxa
ErrorLogLevel      = 7
FileExtend         = 200
Striping           = 0
TempStorage        = TempDatabase

[TempDatabase]
DatabaseFile    = {dir}/virtuoso-temp.db
TransactionFile = {dir}/virtuoso-temp.trx
Striping        = 0

[Parameters]
ServerPort           = 127.0.0.1:{sql_port}
DisableUnixSocket    = 1
MaxClientConnections = 10
CheckpointInterval   = 60
CaseMode             = 2
DirsAllowed          = ., {data_dir}
; ~16 MB of buffers: enough for test KGs, small enough for any CI machine. Limits not set
; here (MaxSortedTopRows = 10000: ORDER BY with LIMIT + OFFSET above it fails) keep their
; stock values, so tests meet what kgsynth meets on a real deployment.
NumberOfBuffers      = 2000
MaxDirtyBuffers      = 1200
MaxQueryMem          = 256M
ThreadsPerQuery      = 2
AsyncQueueMaxThreads = 4
{extra_parameters}

[HTTPServer]
ServerPort           = 127.0.0.1:{http_port}
ServerRoot           = {dir}/vsp
MaxClientConnections = 10
ServerThreads        = 10
KeepAliveTimeout     = 10
Charset              = UTF-8

[SPARQL]
; The default (10000) silently truncates results; kgsynth's walks need full answers.
ResultSetMaxRows           = 1000000
MaxQueryCostEstimationTime = 400
MaxQueryExecutionTime      = 60
"""


def _isql(sql_port: int, sql: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_which(ISQL_BIN), f"127.0.0.1:{sql_port}", "dba", "dba", f"exec={sql}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _check_default_graph_sees(url: str, graph: str, expected: int) -> None:
    """Fail unless ``graph`` holds ``expected`` triples and a query without FROM sees them."""
    rows = sparql_json(url, f"SELECT (COUNT(*) AS ?n) WHERE {{ GRAPH <{graph}> {{ ?s ?p ?o }} }}")
    loaded = int(rows["results"]["bindings"][0]["n"]["value"])
    if loaded != expected:
        raise ServerStartError(
            f"Virtuoso loaded {loaded} triples into <{graph}>, expected {expected}"
        )
    sample = sparql_json(
        url,
        f"SELECT ?s ?p ?o WHERE {{ GRAPH <{graph}> {{ ?s ?p ?o FILTER(isIRI(?o)) }} }} LIMIT 1",
    )["results"]["bindings"][0]
    s, p, o = (sample[k]["value"] for k in ("s", "p", "o"))
    if not sparql_json(url, f"ASK {{ <{s}> <{p}> <{o}> }}")["boolean"]:
        raise ServerStartError(
            f"Virtuoso's default graph does not include <{graph}>: queries without FROM miss it"
        )


@contextlib.contextmanager
def start_virtuoso(
    nt_path: Path,
    workdir: Path,
    *,
    graph: str = FIXTURE_GRAPH,
    extra_parameters: Mapping[str, str | int] | None = None,
    start_timeout: float = 120.0,
) -> Iterator[SparqlServer]:
    """Start a private Virtuoso in ``workdir``, bulk-load ``nt_path`` into ``graph``.

    Yields a :class:`SparqlServer` whose ``url`` is ``http://127.0.0.1:HTTPPORT/sparql`` and
    whose ``startup_s`` covers database creation, start-up and the load. ``extra_parameters``
    adds lines to the ini's ``[Parameters]`` section (e.g. ``{"MaxSortedTopRows": 100000}``);
    everything not set there keeps Virtuoso's stock default, as on a real deployment.
    """
    reason = virtuoso_missing_reason()
    if reason:
        raise ServerStartError(reason)
    workdir = workdir.resolve()
    if "'" in str(workdir) or "," in str(workdir):
        raise ServerStartError(f"{workdir}: Virtuoso's ini and ld_dir() need a path without ' or ,")
    started = time.monotonic()
    data_dir = workdir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (workdir / "vsp").mkdir(exist_ok=True)
    shutil.copyfile(nt_path, data_dir / "kg.nt")
    sql_port, http_port = free_port(), free_port()
    while http_port == sql_port:
        http_port = free_port()
    ini = workdir / "virtuoso.ini"
    ini.write_text(
        VIRTUOSO_INI.format(
            dir=workdir,
            data_dir=data_dir,
            sql_port=sql_port,
            http_port=http_port,
            extra_parameters="\n".join(f"{k} = {v}" for k, v in (extra_parameters or {}).items()),
        )
    )
    log_path = workdir / "virtuoso-t.out"
    url = f"http://127.0.0.1:{http_port}/sparql"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [_which(VIRTUOSO_BIN), "+foreground", "+configfile", str(ini)],
            cwd=workdir,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise ServerStartError(
                    f"virtuoso-t exited with {proc.returncode} during start-up; "
                    f"log:\n{_tail(log_path)}"
                )
            if _isql(sql_port, "select 1;", timeout=10).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"Virtuoso's ISQL port {sql_port} did not answer in {start_timeout:.0f}s; "
                    f"log:\n{_tail(log_path)}"
                )
            time.sleep(0.1)
        load = _isql(
            sql_port,
            f"ld_dir('{data_dir}', 'kg.nt', '{graph}'); rdf_loader_run(); checkpoint;",
            timeout=start_timeout,
        )
        if load.returncode != 0 or "*** Error" in load.stdout + load.stderr:
            raise ServerStartError(f"Virtuoso bulk load failed:\n{load.stdout}\n{load.stderr}")
        _wait_for_sparql(url, proc, log_path, deadline)
        _check_default_graph_sees(url, graph, count_triples(nt_path))
        server = SparqlServer(url, proc.pid, time.monotonic() - started, workdir)
        log.info("virtuoso pid %d serving %s (start+load %.2fs)", proc.pid, url, server.startup_s)
        yield server
    finally:
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                _isql(sql_port, "shutdown;", timeout=30)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_process(proc)
