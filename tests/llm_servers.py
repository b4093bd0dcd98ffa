"""OpenAI-compatible servers for tests and benchmarks: a real one, a counting proxy, a fake.

Plain context managers (no pytest needed), so a benchmark or a shell session can use them too::

    from tests.llm_servers import FakeOpenAIServer, Reply, start_transformers_serve

    with start_transformers_serve(Path("runs/tiny"), Path("/tmp/serve")) as served:
        print(served.base_url, served.model)  # http://127.0.0.1:PORT/v1  runs/tiny

    with FakeOpenAIServer([Reply(429, headers={"Retry-After": "1"}), Reply()]) as fake:
        ...  # fake.base_url; fake.requests counts chat-completion requests

- :func:`start_transformers_serve` runs ``transformers serve MODEL_DIR --device cpu`` offline
  (``HF_HUB_OFFLINE=1``, ``HF_HOME`` at a private folder with an empty ``hub/``: without it
  ``/v1/models`` answers 500). The server is pinned to that model: requests must name it
  exactly as it was passed (the folder path as a string).
- :class:`CountingProxy` forwards every request to an upstream server and counts the
  chat-completion requests that reach it, so a test can prove that a cached re-run makes none.
- :class:`FakeOpenAIServer` answers ``/v1/chat/completions`` from a script of :class:`Reply`
  objects (status, body, headers, delay), counts requests and the most that were in flight at
  once, and reports both on ``GET /_stats``.

Every server binds 127.0.0.1 on a free port; processes are stopped by their own pid and
threaded servers are shut down by the context manager that started them.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.servers import ServerStartError, free_port, stop_process

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
STATS_PATH = "/_stats"


class _QuietThreadingServer(ThreadingHTTPServer):
    """Threads per connection, a deep accept queue (clients open dozens of connections at once;
    the stock backlog of 5 drops SYNs and adds second-long retransmit stalls), no lingering."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def _send(
    handler: BaseHTTPRequestHandler, status: int, payload: bytes, headers: Mapping[str, str]
) -> None:
    handler.send_response(status)
    lowered = {k.lower() for k in headers}
    if "content-type" not in lowered:
        handler.send_header("Content-Type", "application/json")
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


# --- the fake server -------------------------------------------------------------------------


def chat_completion(
    text: str | None,
    *,
    prompt_tokens: int = 3,
    completion_tokens: int = 5,
    finish_reason: str = "stop",
    model: str = "fake-model",
) -> dict[str, Any]:
    """A ``chat.completion`` response body; ``text=None`` writes ``"content": null``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def echo_text(body: Mapping[str, Any] | None) -> str:
    """What an echo reply says for a request body: ``echo: <last message content>``."""
    messages = (body or {}).get("messages") or [{}]
    return f"echo: {messages[-1].get('content')}"


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``body``: a dict (sent as JSON), raw bytes (sent as they are), or
    None for a chat completion that echoes the request's last message. ``delay`` seconds pass
    before the answer is sent."""

    status: int = 200
    body: Mapping[str, Any] | bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0

    def payload(self, request_body: Mapping[str, Any] | None) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if self.body is None:
            return json.dumps(chat_completion(echo_text(request_body))).encode()
        return json.dumps(self.body).encode()


Script = Sequence[Reply] | Callable[[int, Mapping[str, Any] | None], Reply]


class FakeOpenAIServer:
    """A scripted ``/v1/chat/completions`` on 127.0.0.1 in a background thread.

    ``script`` is a sequence (request *n*, counted from 0, gets ``script[n]``, and the last
    entry repeats) or a function ``(n, request_body) -> Reply``. ``requests`` counts the
    chat-completion requests that arrived, ``bodies`` and ``auth_headers`` keep what they
    carried, ``max_in_flight`` is the most that had arrived and were not yet answered.
    """

    def __init__(self, script: Script = (Reply(),), *, port: int | None = None) -> None:
        if not callable(script) and not script:
            raise ValueError("script: give at least one Reply")
        self.script = script
        self.port = port or free_port()
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any] | None] = []
        self.auth_headers: list[str | None] = []
        self._lock = threading.Lock()
        self._httpd: _QuietThreadingServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _arrive(self, raw: bytes, auth: str | None) -> tuple[int, dict[str, Any] | None]:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            n = self.requests
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.bodies.append(body)
            self.auth_headers.append(auth)
        return n, body

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _reply(self, n: int, body: Mapping[str, Any] | None) -> Reply:
        if callable(self.script):
            return self.script(n, body)
        return self.script[min(n, len(self.script) - 1)]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"requests": self.requests, "max_in_flight": self.max_in_flight}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
            # headers and body go out in separate writes: without TCP_NODELAY, Nagle's
            # algorithm meets the client's delayed ACK and adds ~40 ms to every answer
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == STATS_PATH:
                    _send(self, 200, json.dumps(fake.stats()).encode(), {})
                else:
                    _send(self, 404, b'{"error": {"message": "not found"}}', {})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != CHAT_PATH:
                    _send(self, 404, b'{"error": {"message": "not found"}}', {})
                    return
                n, body = fake._arrive(raw, self.headers.get("Authorization"))
                try:
                    reply = fake._reply(n, body)
                    if reply.delay:
                        time.sleep(reply.delay)
                    payload = reply.payload(body)
                finally:
                    # before the answer goes out: the client cannot send its next request
                    # until it has this one, so in-flight counts never overlap spuriously
                    fake._leave()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    _send(self, reply.status, payload, reply.headers)

        return Handler

    def start(self) -> FakeOpenAIServer:
        self._httpd = _QuietThreadingServer(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_fake_forever(port: int, reply: Reply) -> None:
    """Run a :class:`FakeOpenAIServer` answering every request with ``reply`` until killed
    (the target of a separate server process, e.g. in a benchmark)."""
    server = FakeOpenAIServer([reply], port=port).start()
    assert server._thread is not None
    server._thread.join()


def fetch_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and parse its JSON body (urllib only)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until_answering(
    url: str, deadline: float, is_alive: Callable[[], bool] | None = None
) -> None:
    """Poll ``GET url`` until it answers 200, ``is_alive()`` turns false, or ``deadline``."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if is_alive is not None and not is_alive():
            raise ServerStartError(f"the server process exited before {url} answered")
        try:
            fetch_json(url, timeout=2.0)
            return
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.05)
    raise ServerStartError(f"{url} did not answer in time (last error: {last})")


# --- the counting proxy ----------------------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class CountingProxy:
    """Forwards every request on 127.0.0.1 to ``upstream`` (``http://127.0.0.1:PORT``) and
    counts the chat-completion requests that passed through (``requests``)."""

    def __init__(self, upstream: str, *, timeout: float = 120.0) -> None:
        host_port = upstream.removeprefix("http://").split("/", 1)[0]
        host, _, port = host_port.partition(":")
        self.upstream_host = host
        self.upstream_port = int(port or 80)
        self.timeout = timeout
        self.port = free_port()
        self.requests = 0
        self._lock = threading.Lock()
        self._httpd: _QuietThreadingServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # see FakeOpenAIServer

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "POST" and self.path.startswith(CHAT_PATH):
                    with proxy._lock:
                        proxy.requests += 1
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                conn = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=proxy.timeout
                )
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    payload = resp.read()
                    out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP}
                    status = resp.status
                except OSError as exc:
                    status, payload, out = 502, json.dumps({"error": str(exc)}).encode(), {}
                finally:
                    conn.close()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    _send(self, status, payload, out)

            do_GET = do_POST = _forward

        return Handler

    def __enter__(self) -> CountingProxy:
        self._httpd = _QuietThreadingServer(("127.0.0.1", self.port), self._handler())
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


# --- transformers serve ----------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModel:
    """A running ``transformers serve``: its base URL, the model name requests must carry,
    its pid, and how long it took to answer."""

    base_url: str
    model: str
    pid: int
    startup_s: float
    log_path: Path


def transformers_executable() -> str:
    """The ``transformers`` CLI next to this interpreter (the venv's bin)."""
    beside = Path(sys.executable).parent / "transformers"
    if not (beside.is_file() and os.access(beside, os.X_OK)):
        raise ServerStartError(f"{beside} not found: pip install 'transformers[serving]'")
    return str(beside)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-limit:] or "(empty log)"
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def start_transformers_serve(
    model_dir: Path, workdir: Path, *, start_timeout: float = 90.0
) -> Iterator[ServedModel]:
    """Serve ``model_dir`` on CPU with ``transformers serve``, offline, on a free port.

    Yields a :class:`ServedModel` once ``GET /v1/models`` answers; stops the process (by its
    pid) on exit.
    """
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    hf_home = workdir / "hf-home"
    (hf_home / "hub").mkdir(parents=True, exist_ok=True)
    log_path = workdir / "transformers-serve.log"
    port = free_port()
    model = str(model_dir)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(hf_home),
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [
        transformers_executable(),
        "serve",
        model,
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    try:
        try:
            wait_until_answering(
                f"http://127.0.0.1:{port}/v1/models",
                time.monotonic() + start_timeout,
                lambda: proc.poll() is None,
            )
        except ServerStartError as exc:
            raise ServerStartError(f"{exc}; log:\n{_tail(log_path)}") from None
        served = ServedModel(
            f"http://127.0.0.1:{port}/v1", model, proc.pid, time.monotonic() - started, log_path
        )
        log.info(
            "transformers serve pid %d on %s (%.1fs)", proc.pid, served.base_url, served.startup_s
        )
        yield served
    finally:
        stop_process(proc)
