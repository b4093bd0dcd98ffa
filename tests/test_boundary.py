"""Nothing lost, nothing let in (issue 13, parts 4 and 5).

- No secret on disk: a real ``kgsynth`` process run with ``--api-key sk-…`` writes the key into
  no file and no stream, in either ``--api-key X`` or ``--api-key=X`` form, even when the
  server echoes the ``Authorization`` header back in its error.
- Text from outside is made safe where it enters: a model reply, a cached reply, a tool-call
  argument, a SPARQL result or a command-line argument holding lone UTF-16 surrogates does not
  crash ``kg tool``, ``kg query``, ``synthesize questions``, ``synthesize trajectories --mode
  free`` or ``eval``; their Parquet files are readable, and a re-run from the cache works.

Every server is local: :class:`tests.llm_servers.FakeOpenAIServer` for the model, a scripted
SPARQL endpoint below for the KG.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.protocol import parse_answer
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.toolcall import parse_tool_call
from kgsynth.cli import app
from kgsynth.core.text import RedactingFilter, clean_text, redact_argv, redact_text
from kgsynth.kg.endpoint import binding_to_term
from kgsynth.llm.base import Completion, GenerationParams, Request
from kgsynth.llm.cache import CachedLLM, request_key
from kgsynth.llm.openai_backend import OpenAILLM
from tests.kgfixtures import build_pipeline_inputs
from tests.llm_servers import FakeOpenAIServer, Reply, _QuietThreadingServer, _send, chat_completion
from tests.servers import free_port

runner = CliRunner()
SECRET = "sk-SECRET123"
LONE = "\ud83c"  # a high surrogate without its pair: what json.loads makes of "\ud83c"
FFFD = "\ufffd"


def encodable(value: Any) -> bool:
    """True when every string inside ``value`` encodes as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- the pipeline inputs, built once -------------------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store, walks and template questions over the movie facts."""
    root = tmp_path_factory.mktemp("boundary")
    paths = build_pipeline_inputs(root, walks=4, structures="chain-1,chain-2")
    return {k: paths[k] for k in ("store", "walks", "questions")}


# --- part 4: no secrets on disk ------------------------------------------------------------


def test_redact_argv_hides_secret_option_values_in_both_forms() -> None:
    argv = ["kgsynth", "--api-key", SECRET, "--hf-token=hf_abcdefghijkl", "--max-tokens", "64"]
    argv += ["--token", "t0p", "--base-url", "http://user:pw@host/v1"]
    assert redact_argv(argv) == [
        "kgsynth",
        "--api-key",
        "***",
        "--hf-token=***",
        "--max-tokens",
        "64",
        "--token",
        "***",
        "--base-url",
        "http://user:***@host/v1",
    ]


@pytest.mark.parametrize(
    "text",
    [
        f"Error code: 401 - {{'error': {{'message': 'Incorrect API key provided: {SECRET}'}}}}",
        f"headers={{'Authorization': 'Bearer {SECRET}'}}",
        f"Authorization: Bearer {SECRET}",
        f"GET /v1?api_key={SECRET}&x=1",
    ],
)
def test_redact_text_hides_keys_and_authorization_headers(text: str) -> None:
    assert "SECRET123" not in redact_text(text)
    assert "***" in redact_text(text)


def test_redact_text_leaves_ordinary_text_alone() -> None:
    text = "max_tokens=128 prompt_tokens: 5 task-force directed_by Kismet"
    assert redact_text(text) == text
    assert redact_text("the key is hunter22", ["hunter22"]) == "the key is ***"


def test_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("kgsynth.test_boundary")
    caplog.handler.addFilter(RedactingFilter())
    try:
        with caplog.at_level(logging.INFO):
            log.info("retrying with %s", f"Authorization: Bearer {SECRET}")
    finally:
        caplog.handler.filters.clear()
    assert "SECRET123" not in caplog.text and "Authorization: ***" in caplog.text


def kgsynth_command() -> list[str]:
    script = Path(sys.executable).parent / "kgsynth"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kgsynth.cli"]


def files_holding(root: Path, needle: str) -> list[str]:
    """Files under ``root`` whose bytes, Parquet rows or SQLite rows contain ``needle``."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        texts = [data.decode("utf-8", "replace")]
        if data[:4] == b"PAR1":  # compressed pages: look at the decoded rows as well
            texts.append(json.dumps(pq.read_table(path).to_pylist(), default=str))
        if data[:16] == b"SQLite format 3\x00":
            with sqlite3.connect(path) as con:
                texts.append("\n".join(con.iterdump()))
        if any(needle in t for t in texts):
            found.append(str(path.relative_to(root)))
    return found


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_a_real_run_with_an_api_key_writes_it_nowhere(
    inputs: dict[str, Path], tmp_path: Path, form: str
) -> None:
    """``synthesize questions`` against a closed port: every request fails, the command exits
    non-zero after writing its outputs, and neither they nor its streams hold the key."""
    run = tmp_path / "run"
    key_args = ["--api-key", SECRET] if form == "separate" else [f"--api-key={SECRET}"]
    cmd = [*kgsynth_command(), "-v", "synthesize", "questions", "--walks", str(inputs["walks"])]
    cmd += ["--out", str(run / "questions.parquet"), "--llm", "openai", "--model", "m"]
    cmd += ["--base-url", f"http://127.0.0.1:{free_port()}/v1", "--max-retries", "1"]
    cmd += ["--timeout", "5", "--limit", "2", *key_args]
    env = {**os.environ, "KGSYNTH_CACHE": str(tmp_path / "cache"), "OPENAI_API_KEY": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 5, proc.stderr
    assert "2 of 2 LLM requests failed" in proc.stderr and "Traceback" not in proc.stderr
    assert "retry 1" in proc.stderr  # -v: the retry was logged
    written = sorted(p.name for p in run.iterdir())
    assert {
        "questions.parquet",
        "questions.rejected.parquet",
        "questions.manifest.json",
    } <= set(written)
    manifest = json.loads((run / "questions.manifest.json").read_text())
    assert "--api-key" in manifest["command"] and "***" in manifest["command"]
    assert manifest["llm"]["stats"]["errors"] == 2
    assert files_holding(tmp_path, "SECRET123") == []
    assert "SECRET123" not in proc.stderr + proc.stdout


def test_an_echoed_authorization_header_is_redacted_from_stored_errors(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """A server that answers 401 with the request's Authorization header in its body: the
    error text kept in rejected.parquet, and the message printed, hold no key."""
    server = FakeOpenAIServer(
        lambda n, body: Reply(
            401, {"error": {"message": f"refused {server.auth_headers[n]} for {SECRET}"}}
        )
    )
    with server:
        args = ["synthesize", "questions", "--walks", str(inputs["walks"]), "--limit", "2"]
        args += ["--out", str(tmp_path / "q.parquet"), "--llm", "openai", "--model", "m"]
        res = runner.invoke(app, [*args, "--base-url", server.base_url, "--api-key", SECRET])
    assert res.exit_code == 5, res.output
    assert server.auth_headers[0] == f"Bearer {SECRET}"  # the server did see it
    rejected = pq.read_table(tmp_path / "q.rejected.parquet").to_pylist()
    assert [r["reject_reason"] for r in rejected] == ["llm_error", "llm_error"]
    assert all("refused" in r["raw_output"] and "***" in r["raw_output"] for r in rejected)
    assert files_holding(tmp_path, "SECRET123") == []
    assert "SECRET123" not in res.output


# --- part 5: text from outside is made safe at the boundary --------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain ascii", "plain ascii"),
        ("Ōkami 東京 🎬", "Ōkami 東京 🎬"),
        (f"Kismet {LONE}", f"Kismet {FFFD}"),
        ("\udfac x", f"{FFFD} x"),
        ("\udfac\ud83c", f"{FFFD}{FFFD}"),  # a pair in the wrong order is two lone halves
        ("a\ud83c\udfacb", "a🎬b"),  # a pair split into two code points is joined
        ("\udcff", FFFD),  # a non-UTF-8 byte in sys.argv (surrogateescape)
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean
    clean.encode("utf-8")


def test_tool_call_arguments_and_answers_are_cleaned() -> None:
    call = parse_tool_call('get_triples("Kismet \\ud83c", ["directed_by\\udfac"])')
    assert call.args == (f"Kismet {FFFD}", (f"directed_by{FFFD}",))
    assert parse_tool_call(f"get_relations('{LONE}')").args == (FFFD,)
    assert parse_answer('["Bette \\ud83c Davis"]') == [f"Bette {FFFD} Davis"]
    turn = parse_turn('<think>x</think><answer>["\\udfac"]</answer>')
    assert turn.answer == [FFFD] and turn.format_error is None


def test_sparql_binding_values_are_cleaned() -> None:
    raw = json.loads('{"type": "literal", "value": "Kismet \\ud83c", "xml:lang": "en"}')
    assert binding_to_term(raw).value == f"Kismet {FFFD}"


def test_openai_replies_and_cached_replies_are_cleaned(tmp_path: Path) -> None:
    reply = Reply(body=chat_completion(f'get_relations("Kismet {LONE}")'))
    with FakeOpenAIServer([reply]) as server:
        llm = OpenAILLM("m", base_url=server.base_url, api_key="x", max_retries=0)
        cached = CachedLLM(llm, tmp_path / "cache.sqlite")
        request = Request.make([{"role": "user", "content": "q"}], GenerationParams())
        first = cached.generate_batch([request])[0]
    assert first.text == f'get_relations("Kismet {FFFD}")' and first.ok
    # an entry written before replies were cleaned (as json.dumps writes a lone surrogate)
    key = request_key(cached.inner, request)
    old = json.dumps({"text": f"answer {LONE}", "finish_reason": "stop"})
    cached._con.execute("UPDATE completions SET value = ? WHERE key = ?", (old, key))
    again = cached.generate_batch([request])[0]
    assert again.cached and again.text == f"answer {FFFD}"
    cached.close()


def test_a_cache_entry_that_is_not_json_is_a_miss(tmp_path: Path) -> None:
    llm = OpenAILLM("m", base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
    cached = CachedLLM(llm, tmp_path / "cache.sqlite")
    cached._con.execute("INSERT INTO completions VALUES ('k', 'not json')")
    assert cached._get("k") is None
    cached._put("k", Completion("fine"))
    assert cached._get("k") == Completion("fine", cached=True)
    cached.close()


def surrogate_policy(n: int, body: Mapping[str, Any] | None) -> Reply:
    """An agent that asks about an entity and answers with text holding lone surrogates (as
    JSON escapes in the HTTP body, and as a Python escape inside the tool call)."""
    turns = sum(1 for m in (body or {}).get("messages", []) if m.get("role") == "assistant")
    if turns == 0:
        text = f'<think>look {LONE}</think><kg-query>get_relations("Kismet {LONE}")</kg-query>'
    elif turns == 1:
        text = '<think>again</think><kg-query>get_relations("Kismet \\udfac")</kg-query>'
    else:
        text = f'<think>done {LONE}</think><answer>["William {LONE} Dieterle"]</answer>'
    return Reply(body=chat_completion(text))


def all_strings_encodable(path: Path) -> list[dict[str, Any]]:
    rows = pq.read_table(path).to_pylist()
    assert encodable(rows), path
    return rows


def test_synthesize_questions_survives_surrogate_replies_and_reruns_from_cache(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "questions.parquet"
    args = ["synthesize", "questions", "--walks", str(inputs["walks"]), "--out", str(out)]
    args += ["--llm", "openai", "--model", "m", "--api-key", "x", "--no-judge"]
    reply = Reply(body=chat_completion(f"<question>Which film {LONE} is it?</question>"))
    with FakeOpenAIServer([reply]) as server:
        res = runner.invoke(app, [*args, "--base-url", server.base_url])
        assert res.exit_code == 0, res.output
        assert server.requests == 4
    rejected = tmp_path / "questions.rejected.parquet"
    rows = all_strings_encodable(out) + all_strings_encodable(rejected)
    assert len(rows) == 4
    assert any(r["question"] == f"Which film {FFFD} is it?" for r in rows)
    # the server is gone: the re-run reads every reply from the cache
    args.append("--overwrite")
    res = runner.invoke(app, [*args, "--base-url", server.base_url])
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "questions.manifest.json").read_text())["llm"]["stats"]
    assert (stats["cache_hits"], stats["cache_misses"]) == (4, 0)
    assert all_strings_encodable(out) + all_strings_encodable(rejected) == rows
    # a cache written before replies were cleaned holds the surrogate itself
    with sqlite3.connect(tmp_path / "llm_cache.sqlite") as con:
        for key, value in con.execute("SELECT key, value FROM completions").fetchall():
            data = json.loads(value)
            data["text"] = data["text"].replace(FFFD, LONE)
            con.execute("UPDATE completions SET value = ? WHERE key = ?", (json.dumps(data), key))
    res = runner.invoke(app, [*args, "--base-url", server.base_url])
    assert res.exit_code == 0, res.output
    assert all_strings_encodable(out) + all_strings_encodable(rejected) == rows


def test_free_trajectories_survive_surrogates_in_replies_and_tool_calls(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "trajectories.parquet"
    args = ["synthesize", "trajectories", "--questions", str(inputs["questions"])]
    args += ["--out", str(out), "--kg", str(inputs["store"]), "--mode", "free", "--limit", "2"]
    args += ["--llm", "openai", "--model", "m", "--api-key", "x", "--max-turns", "4"]
    with FakeOpenAIServer(surrogate_policy) as server:
        res = runner.invoke(app, [*args, "--base-url", server.base_url])
        assert res.exit_code == 0, res.output
    rejected = tmp_path / "trajectories.rejected.parquet"
    rows = all_strings_encodable(out) + all_strings_encodable(rejected)
    assert len(rows) == 2
    for row in rows:
        assert row["tool_calls"] == [
            f'get_relations("Kismet {FFFD}")',
            'get_relations("Kismet \\udfac")',  # the model's text, kept as written
        ]
        assert row["predicted_answers"] == [f"William {FFFD} Dieterle"]
        observations = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        assert all(f"Kismet {FFFD}" in o for o in observations)  # entity not found, named
    res = runner.invoke(app, [*args, "--base-url", server.base_url, "--overwrite"])  # cached
    assert res.exit_code == 0, res.output
    assert len(all_strings_encodable(out)) + len(all_strings_encodable(rejected)) == 2


def test_eval_survives_surrogate_replies(inputs: dict[str, Path], tmp_path: Path) -> None:
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(
        json.dumps(
            {
                "question": "who directed [Kismet]",
                "topic_names": ["Kismet"],
                "answer_names": ["William Dieterle"],
            }
        )
        + "\n"
    )
    with FakeOpenAIServer(surrogate_policy) as server:
        args = ["eval", "--questions", str(qfile), "--kg", str(inputs["store"]), "--api-key", "x"]
        args += ["--out", str(tmp_path / "eval"), "--llm", "openai", "--model", "m"]
        res = runner.invoke(app, [*args, "--base-url", server.base_url, "--max-turns", "4"])
    assert res.exit_code == 0, res.output
    rows = all_strings_encodable(tmp_path / "eval" / "predictions.parquet")
    assert rows[0]["predicted"] == [f"William {FFFD} Dieterle"]


def test_kg_tool_cleans_its_call_argument(inputs: dict[str, Path]) -> None:
    for call in (f'get_relations("Kismet {LONE}")', 'get_relations("Kismet \\ud83c")'):
        res = runner.invoke(app, ["kg", "tool", "--kg", str(inputs["store"]), call])
        assert res.exit_code == 1 and "entity_not_found" in res.output, res.output
        assert f"Kismet {FFFD}" in res.output
    res = runner.invoke(
        app,
        ["kg", "tool", "--kg", str(inputs["store"]), "--question", LONE, "get_relations('Kismet')"],
    )
    assert res.exit_code == 0 and "directed_by" in res.output, res.output


class FakeSparqlEndpoint:
    """A SPARQL endpoint on 127.0.0.1 whose every SELECT answers ``bindings`` as JSON (with
    ``ensure_ascii``, so a lone surrogate travels as a ``\\ud83c`` escape)."""

    def __init__(self, bindings: list[dict[str, Any]]) -> None:
        self.body = json.dumps(
            {
                "head": {"vars": sorted({k for b in bindings for k in b})},
                "results": {"bindings": bindings},
            }
        ).encode()
        self.port = free_port()
        self._httpd: _QuietThreadingServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/sparql"

    def __enter__(self) -> FakeSparqlEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                _send(self, 200, endpoint.body, {"Content-Type": "application/sparql-results+json"})

        self._httpd = _QuietThreadingServer(("127.0.0.1", self.port), Handler)
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def surrogate_endpoint() -> Iterator[FakeSparqlEndpoint]:
    with FakeSparqlEndpoint(
        [
            {"o": {"type": "literal", "value": f"Kismet {LONE}"}},
            {"o": {"type": "uri", "value": f"http://x/{LONE}"}},
        ]
    ) as endpoint:
        yield endpoint


@pytest.mark.parametrize("fmt", ["tsv", "json"])
def test_kg_query_prints_endpoint_values_with_surrogates(
    surrogate_endpoint: FakeSparqlEndpoint, fmt: str
) -> None:
    args = ["kg", "query", "--kg", surrogate_endpoint.url, "--profile", "generic"]
    res = runner.invoke(app, [*args, "--format", fmt, "SELECT ?o WHERE { ?s ?p ?o }"])
    assert res.exit_code == 0, res.output
    assert f"Kismet {FFFD}" in res.output and f"http://x/{FFFD}" in res.output
