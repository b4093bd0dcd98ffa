"""A key in a URL is not kept (issue 41, item 6).

``--base-url "http://host/v1?key=…"`` and ``--kg "http://host/sparql?key=…"`` carry a secret in
the URL: it must not reach the manifest (the recorded command line and the ``base_url``
field), an error message, the rejected rows or the request cache, even when the server echoes
the request's URL and key back in its replies."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.core.errors import KGUnavailableError
from kgsynth.core.text import redact_argv, redact_text, url_secrets
from kgsynth.kg.endpoint import SparqlEndpointKG
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.openai_backend import OpenAILLM
from tests.kgfixtures import build_pipeline_inputs
from tests.llm_servers import _QuietThreadingServer, _send, chat_completion
from tests.servers import free_port
from tests.test_boundary import files_holding, kgsynth_command

URL_KEY = "URLSECRET123"
API_KEY = "sk-APISECRET456"


def test_redact_text_hides_secret_query_parameters() -> None:
    cases = {
        f"http://host/v1?key={URL_KEY}": "http://host/v1?key=***",
        f"http://h/v1?a=1&apikey={URL_KEY}&b=2": "http://h/v1?a=1&apikey=***&b=2",
        f"http://h/x?X-Amz-Signature={URL_KEY}&X-Amz-Date=1": "http://h/x?X-Amz-Signature=***&X-Amz-Date=1",
        f"GET /s?auth={URL_KEY};sig={URL_KEY}#top": "GET /s?auth=***;sig=***#top",
        f"http://h/s?access_token={URL_KEY}": "http://h/s?access_token=***",
        f"https://me:{URL_KEY}@h/v1?page=2": "https://me:***@h/v1?page=2",
        # parameters that are no secret stay, even with "key" inside a longer name
        "http://h/v1?monkey=1&page=2&api-version=2024": "http://h/v1?monkey=1&page=2&api-version=2024",
    }  # fmt: skip
    assert {text: redact_text(text) for text in cases} == cases


def test_redact_argv_hides_a_key_in_a_url_in_either_form() -> None:
    url = f"http://host/v1?key={URL_KEY}"
    assert redact_argv(["kgsynth", "--base-url", url, f"--kg={url}"]) == [
        "kgsynth",
        "--base-url",
        "http://host/v1?key=***",
        "--kg=http://host/v1?key=***",
    ]


def test_url_secrets_lists_the_credentials_as_written_and_decoded() -> None:
    url = "http://me:p%40ss@h/v1?key=a%2Fb&page=2&token=tok1"
    assert url_secrets(url) == ["p%40ss", "p@ss", "a%2Fb", "a/b", "tok1"]
    assert url_secrets("http://h/v1?page=2") == [] and url_secrets(None) == []


def test_the_endpoint_names_its_url_without_the_key() -> None:
    url = f"http://127.0.0.1:{free_port()}/sparql?key={URL_KEY}"
    kg = SparqlEndpointKG(url, get_profile("generic"), retries=0, timeout=5)
    with pytest.raises(KGUnavailableError) as err:
        kg.select("SELECT ?s WHERE { ?s ?p ?o } LIMIT 1")
    assert URL_KEY not in str(err.value) and "sparql?key=***" in str(err.value)
    assert kg.describe()["location"].endswith("/sparql?key=***")
    assert kg.location == url  # the real URL is still the one queried


def test_kg_command_errors_hold_no_key_in_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/sparql?key={URL_KEY}"
    res = CliRunner().invoke(app, ["kg", "query", "--kg", url, "SELECT ?s WHERE { ?s ?p ?o }"])
    assert res.exit_code != 0
    assert URL_KEY not in res.output and "key=***" in res.output, res.output


# --- a model server that echoes what it was sent ---------------------------------------------


class EchoServer:
    """``/v1/chat/completions`` (with any query string) answering with the request's URL and
    ``Authorization`` header: what a careless proxy or debug server puts in its replies."""

    def __init__(self) -> None:
        self.port = free_port()
        self.paths: list[str] = []
        self._httpd = _QuietThreadingServer(("127.0.0.1", self.port), self._handler())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        echo = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                echo.paths.append(self.path)
                if self.path.split("?")[0] != "/v1/chat/completions":
                    _send(self, 404, b'{"error": {"message": "not found"}}', {})
                    return
                text = f"You called {self.path} with {self.headers.get('Authorization')}"
                _send(self, 200, json.dumps(chat_completion(text)).encode(), {})

        return Handler

    def __enter__(self) -> EchoServer:
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture(scope="module")
def walks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("url_secrets")
    return build_pipeline_inputs(root, walks=3, structures="chain-1")["walks"]


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with EchoServer() as server:
        yield server


def test_a_key_in_the_base_url_reaches_the_server_and_no_file(
    walks: Path, echo: EchoServer, tmp_path: Path
) -> None:
    """A real process: the query string goes with every request (to /v1/chat/completions, not
    glued before the path), and neither key reaches the manifest, the rejected rows, the cache
    or the streams, although every reply holds both."""
    run = tmp_path / "run"
    base_url = f"http://127.0.0.1:{echo.port}/v1?key={URL_KEY}"
    cmd = [*kgsynth_command(), "synthesize", "questions", "--walks", str(walks)]
    cmd += ["--out", str(run / "questions.parquet"), "--llm", "openai", "--model", "m"]
    cmd += ["--base-url", base_url, "--api-key", API_KEY, "--max-retries", "0"]
    cmd += ["--max-failed-fraction", "1"]
    env = {**os.environ, "OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert echo.paths and all(p == f"/v1/chat/completions?key={URL_KEY}" for p in echo.paths)

    manifest = json.loads((run / "questions.manifest.json").read_text())
    assert "--base-url" in manifest["command"] and "?key=***" in manifest["command"]
    assert manifest["llm"]["base_url"] == f"http://127.0.0.1:{echo.port}/v1?key=***"
    rejected = pq.read_table(run / "questions.rejected.parquet").to_pylist()
    assert rejected and all(
        "You called /v1/chat/completions?key=***" in r["raw_output"] for r in rejected
    )
    assert (run / "llm_cache.sqlite").is_file()
    for secret in (URL_KEY, "APISECRET456"):
        assert files_holding(tmp_path, secret) == []
        assert secret not in proc.stdout + proc.stderr


def test_replies_lose_the_known_secrets_and_nothing_else(echo: EchoServer) -> None:
    """Only the values this client sent are hidden in a reply; a short placeholder key is no
    secret and ordinary words stay."""
    from kgsynth.llm.base import Request

    base_url = f"http://127.0.0.1:{echo.port}/v1?key={URL_KEY}&page=2"
    llm = OpenAILLM("m", base_url=base_url, api_key=API_KEY, max_retries=0)
    reply = llm.generate_batch([Request.make([{"role": "user", "content": "q"}])])[0]
    assert reply.ok
    assert reply.text == "You called /v1/chat/completions?key=***&page=2 with Bearer ***"
    assert llm.key_fields["base_url"].endswith("/v1?key=***&page=2")
    local = OpenAILLM("m", base_url=f"http://127.0.0.1:{echo.port}/v1", max_retries=0)
    assert local.api_key == "EMPTY" and local.secrets == ()
