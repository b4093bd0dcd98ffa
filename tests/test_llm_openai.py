"""The openai backend over real HTTP: a real ``transformers serve`` with a tiny model, a
scripted fake server for every fault the backend claims to handle, and a kill -9 of a
cached run.

Nothing here leaves 127.0.0.1: every server is started by the test on a free port, and the
one case without a base URL fails on configuration before any request.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.llm.base import Completion, GenerationParams, Request
from kgsynth.llm.cache import CachedLLM
from kgsynth.llm.openai_backend import OpenAILLM
from kgsynth.train.tiny import build_tiny_model
from tests.llm_servers import (
    CountingProxy,
    FakeOpenAIServer,
    Reply,
    ServedModel,
    chat_completion,
    echo_text,
    start_transformers_serve,
)
from tests.servers import free_port

TEXTS = [
    "who directed Kismet? <think>Find the director.</think>",
    '<kg-query>get_relations("Kismet")</kg-query>',
    '<answer>["Vincente Minnelli"]</answer>',
    "The Matrix was released in 1999 and starred Keanu Reeves.",
]


def ask(text: str, **params: Any) -> Request:
    return Request.make([{"role": "user", "content": text}], GenerationParams(**params))


def fields(c: Completion) -> tuple[str, str | None, int, int, str | None]:
    return (c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.error)


# --- a. a real server: transformers serve with a tiny model ----------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    """``transformers serve`` on CPU with a tiny model built here; started once per module."""
    root = tmp_path_factory.mktemp("served")
    model_dir = build_tiny_model(TEXTS, root / "model")
    with start_transformers_serve(model_dir, root / "serve") as server:
        yield server


@pytest.fixture
def proxy(served: ServedModel) -> Iterator[CountingProxy]:
    """A counting proxy in front of the server: ``proxy.requests`` is what reached it."""
    with CountingProxy(served.base_url) as counting:
        yield counting


def served_requests(n: int = 6) -> list[Request]:
    return [ask(f"question {i}: who directed film {i}?", max_tokens=3 + i) for i in range(n)]


def test_generate_batch_against_transformers_serve(
    served: ServedModel, proxy: CountingProxy
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(served.model)
    requests = served_requests()
    llm = OpenAILLM(served.model, base_url=proxy.base_url, concurrency=3, timeout=60)
    seen: list[int] = []
    out = llm.generate_batch(requests, progress=lambda i, c: seen.append(i))
    assert proxy.requests == len(requests)
    assert sorted(seen) == list(range(len(requests)))
    for req, c in zip(requests, out, strict=True):
        assert c.ok, c.error
        assert isinstance(c.text, str)
        assert c.finish_reason in ("stop", "length")
        assert 0 < c.completion_tokens <= req.params.max_tokens
        prompt = tok.apply_chat_template(
            req.message_dicts(), add_generation_prompt=True, return_dict=True
        )["input_ids"]
        assert c.prompt_tokens == len(prompt)
    assert llm.stats.retries == 0


def test_cache_reruns_make_zero_requests_and_survive_reopening(
    served: ServedModel, proxy: CountingProxy, tmp_path: Path
) -> None:
    path = tmp_path / "llm_cache.sqlite"
    requests = served_requests()

    def cached() -> CachedLLM:
        return CachedLLM(OpenAILLM(served.model, base_url=proxy.base_url, timeout=60), path)

    first_llm = cached()
    first = first_llm.generate_batch(requests)
    assert all(c.ok and not c.cached for c in first)
    assert proxy.requests == len(requests)
    assert first_llm.stats.cache_misses == len(requests) and first_llm.stats.cache_hits == 0
    assert first_llm.stats.prompt_tokens == sum(c.prompt_tokens for c in first) > 0
    assert first_llm.stats.completion_tokens == sum(c.completion_tokens for c in first) > 0

    again = first_llm.generate_batch(requests)
    assert proxy.requests == len(requests), "a warm cache sent requests"
    assert [fields(c) for c in again] == [fields(c) for c in first]
    assert all(c.cached for c in again)
    first_llm.close()

    reopened = cached()
    from_disk = reopened.generate_batch(requests)
    assert proxy.requests == len(requests), "the reopened cache sent requests"
    assert [fields(c) for c in from_disk] == [fields(c) for c in first]
    assert all(c.cached for c in from_disk)
    assert reopened.stats.cache_hits == len(requests) and reopened.stats.cache_misses == 0

    # one new request among cached ones: exactly one request reaches the server
    mixed = reopened.generate_batch([requests[0], ask("a new question", max_tokens=4), requests[1]])
    assert proxy.requests == len(requests) + 1
    assert [c.cached for c in mixed] == [True, False, True]
    reopened.close()


def test_a_model_name_the_server_does_not_serve_is_an_error_without_retry(
    served: ServedModel, proxy: CountingProxy
) -> None:
    llm = OpenAILLM("not-the-served-model", base_url=proxy.base_url, max_retries=3, backoff=0.01)
    c = llm.generate([{"role": "user", "content": "hi"}], max_tokens=4)
    assert not c.ok and c.error is not None and c.error.startswith("HTTP 400")
    assert proxy.requests == 1 and llm.stats.retries == 0


# --- b. faults, scripted -------------------------------------------------------------------


def fast_llm(server: FakeOpenAIServer, **options: Any) -> OpenAILLM:
    """A backend with millisecond backoff, so retry tests cost no time."""
    return OpenAILLM("fake-model", base_url=server.base_url, **{"backoff": 0.01, **options})


HI = [{"role": "user", "content": "hi"}]
ERROR_BODY = {"error": {"message": "scripted failure", "type": "test"}}


def test_request_carries_the_generation_parameters() -> None:
    with FakeOpenAIServer() as server:
        c = fast_llm(server).generate(
            HI, temperature=0.5, top_p=0.9, max_tokens=7, stop=["</answer>"], seed=3
        )
    assert fields(c) == ("echo: hi", "stop", 3, 5, None)
    body = server.bodies[0]
    assert body is not None
    assert body["model"] == "fake-model" and body["messages"] == HI
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.5, 0.9, 7)
    assert (body["stop"], body["seed"]) == (["</answer>"], 3)
    assert server.requests == 1


def test_429_retry_after_is_honoured() -> None:
    script = [Reply(429, ERROR_BODY, {"Retry-After": "1"}), Reply()]
    with FakeOpenAIServer(script) as server:
        llm = fast_llm(server)
        started = time.monotonic()
        c = llm.generate(HI)
        elapsed = time.monotonic() - started
    assert c.ok and c.text == "echo: hi"
    assert server.requests == 2 and llm.stats.retries == 1
    assert elapsed >= 0.95, f"Retry-After: 1 honoured for only {elapsed:.2f}s"


def test_429_retry_after_ms_takes_precedence() -> None:
    script = [Reply(429, ERROR_BODY, {"retry-after-ms": "300", "Retry-After": "30"}), Reply()]
    with FakeOpenAIServer(script) as server:
        started = time.monotonic()
        c = fast_llm(server).generate(HI)
        elapsed = time.monotonic() - started
    assert c.ok and server.requests == 2
    assert 0.28 <= elapsed < 10


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 409])
def test_transient_status_then_success_is_retried(status: int) -> None:
    with FakeOpenAIServer([Reply(status, ERROR_BODY), Reply()]) as server:
        llm = fast_llm(server)
        c = llm.generate(HI)
    assert fields(c) == ("echo: hi", "stop", 3, 5, None)
    assert server.requests == 2 and llm.stats.retries == 1


def test_persistent_503_gives_an_error_result_after_all_retries() -> None:
    with FakeOpenAIServer([Reply(503, b"down for maintenance")]) as server:
        llm = fast_llm(server, max_retries=3)
        c = llm.generate(HI)
    assert server.requests == 4 and llm.stats.retries == 3
    assert not c.ok and c.text == ""
    assert c.error is not None and c.error.startswith("gave up after 4 attempts: HTTP 503")


def test_a_server_slower_than_the_timeout_is_retried_then_an_error() -> None:
    with FakeOpenAIServer([Reply(delay=1.5)]) as server:
        llm = fast_llm(server, timeout=0.3, max_retries=1)
        started = time.monotonic()
        c = llm.generate(HI)
        elapsed = time.monotonic() - started
    assert server.requests == 2 and llm.stats.retries == 1
    assert c.error == "gave up after 2 attempts: timed out after 0s"
    # two 0.3 s attempts and the client's first backoff (0.375-0.5 s); waiting for the slow
    # answer would have taken 1.5 s and got it
    assert elapsed < 1.45, "the client waited for the slow answer"


def test_the_clients_backoff_doubles_between_retries() -> None:
    """The openai client retries itself (max_retries), 0.5 s doubling, less up to a quarter
    at random: three 503s, then an answer, arrive about 0.5, 1 and 2 s apart."""
    arrivals: list[float] = []

    def script(n: int, body: Mapping[str, Any] | None) -> Reply:
        arrivals.append(time.monotonic())
        return Reply(503, ERROR_BODY) if n < 3 else Reply()

    with FakeOpenAIServer(script) as server:
        llm = fast_llm(server, max_retries=3)
        c = llm.generate(HI)
    assert c.ok and server.requests == 4 and llm.stats.retries == 3
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    for gap, full in zip(gaps, (0.5, 1.0, 2.0), strict=True):
        assert 0.75 * full - 0.02 <= gap <= full + 0.3, gaps


@pytest.mark.parametrize(("max_retries", "ok"), [(3, True), (2, False)])
def test_client_retries_and_unreadable_retries_share_one_budget(max_retries: int, ok: bool) -> None:
    """503 (the client retries it), garbage (kgsynth does), 503, then an answer: four attempts,
    so three retries reach it and two give up after three attempts."""
    script = [
        Reply(503, ERROR_BODY),
        Reply(200, b"{not json}"),
        Reply(503, ERROR_BODY),
        Reply(),
    ]
    with FakeOpenAIServer(script) as server:
        llm = fast_llm(server, max_retries=max_retries)
        c = llm.generate(HI)
    assert c.ok is ok and server.requests == (4 if ok else 3)
    assert llm.stats.retries == server.requests - 1
    if not ok:
        assert c.error is not None and c.error.startswith("gave up after 3 attempts: HTTP 503")


def test_connection_refused_gives_an_error_result() -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    llm = OpenAILLM("fake-model", base_url=closed, max_retries=2, backoff=0.01)
    c = llm.generate(HI)
    assert not c.ok and llm.stats.retries == 2
    assert c.error is not None and c.error.startswith("gave up after 3 attempts: connection error")


@pytest.mark.parametrize(
    "reply",
    [
        Reply(200, b'{"id": "x", "choices": [{"message": '),  # cut-off JSON
        Reply(200, b"{not json}"),
        Reply(200, chat_completion(None)),  # "content": null
        Reply(200, {"id": "x", "object": "chat.completion", "choices": []}),
        Reply(200, b"<html>gateway says hi</html>", {"Content-Type": "text/html"}),
    ],
    ids=["truncated-json", "malformed-json", "null-content", "no-choices", "html"],
)
def test_unreadable_responses_are_retried_then_an_error(reply: Reply) -> None:
    with FakeOpenAIServer([reply]) as server:
        llm = fast_llm(server, max_retries=2)
        c = llm.generate(HI)
    assert server.requests == 3 and llm.stats.retries == 2
    assert not c.ok and c.text == ""
    assert c.error is not None and "unreadable response" in c.error


@pytest.mark.parametrize("text", ["", "   ", "%%% <answer [garbage", "\x00\ufffd"])
def test_empty_or_garbage_content_is_returned_as_is(text: str) -> None:
    # the stage's parser rejects it with a reason; the backend does not judge text
    with FakeOpenAIServer([Reply(200, chat_completion(text, finish_reason="length"))]) as server:
        llm = fast_llm(server)
        c = llm.generate(HI)
    assert fields(c) == (text, "length", 3, 5, None)
    assert server.requests == 1 and llm.stats.retries == 0


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    with FakeOpenAIServer([Reply(status, ERROR_BODY), Reply()]) as server:
        llm = fast_llm(server, max_retries=5)
        c = llm.generate(HI)
    assert server.requests == 1 and llm.stats.retries == 0
    assert c.error is not None and c.error.startswith(f"HTTP {status}: ")
    assert "scripted failure" in c.error


def test_failures_come_back_in_place_within_a_batch() -> None:
    def script(n: int, body: Mapping[str, Any] | None) -> Reply:
        return Reply(400, ERROR_BODY) if "bad" in echo_text(body) else Reply()

    texts = ["q0", "bad q1", "q2", "bad q3", "q4"]
    with FakeOpenAIServer(script) as server:
        out = fast_llm(server, concurrency=3).generate_batch([ask(t) for t in texts])
    assert [c.text for c in out] == ["echo: q0", "", "echo: q2", "", "echo: q4"]
    assert [c.ok for c in out] == [True, False, True, False, True]
    assert server.requests == 5


def test_concurrency_bounds_requests_in_flight() -> None:
    with FakeOpenAIServer([Reply(delay=0.2)]) as server:
        out = fast_llm(server, concurrency=4).generate_batch([ask(f"q{i}") for i in range(16)])
    assert [c.text for c in out] == [f"echo: q{i}" for i in range(16)]
    assert server.requests == 16
    assert server.max_in_flight == 4


def test_environment_supplies_base_url_and_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAIServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
        llm = OpenAILLM("fake-model", max_retries=0)
        assert llm.base_url == server.base_url
        assert llm.key_fields["base_url"] == server.base_url
        assert llm.generate(HI).ok
        assert server.auth_headers == ["Bearer sk-from-env"]


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")  # closed
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with FakeOpenAIServer() as server:
        llm = OpenAILLM("fake-model", base_url=server.base_url, api_key="sk-arg", max_retries=0)
        assert llm.generate(HI).ok
    assert server.auth_headers == ["Bearer sk-arg"]


def test_local_server_without_a_key_sends_a_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAIServer() as server:
        assert OpenAILLM("fake-model", base_url=server.base_url).generate(HI).ok
    assert server.auth_headers == ["Bearer EMPTY"]


def test_no_key_and_no_base_url_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="--api-key"):
        OpenAILLM("gpt-4o-mini")
    with pytest.raises(ConfigError, match="--concurrency"):
        OpenAILLM("m", base_url="http://127.0.0.1:9/v1", concurrency=0)


def test_unparseable_retry_after_falls_back_to_backoff() -> None:
    with FakeOpenAIServer([Reply(429, ERROR_BODY, {"Retry-After": "soon"}), Reply()]) as server:
        c = fast_llm(server).generate(HI)
    assert c.ok and server.requests == 2


def test_backend_stats_count_requests_and_tokens_without_a_cache() -> None:
    with FakeOpenAIServer() as server:
        llm = fast_llm(server)
        llm.generate_batch([ask("a"), ask("b")])
    assert (llm.stats.requests, llm.stats.prompt_tokens, llm.stats.completion_tokens) == (2, 6, 10)


# --- c. kill -9 in the middle of a cached run ------------------------------------------------

KILLED_RUN = """
import sys
from kgsynth.llm.base import GenerationParams, Request
from kgsynth.llm.cache import CachedLLM
from kgsynth.llm.openai_backend import OpenAILLM

base_url, cache, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = CachedLLM(OpenAILLM("fake-model", base_url=base_url, concurrency=2, max_retries=0), cache)
llm.generate_batch(
    [Request.make([{"role": "user", "content": f"question {i}"}], GenerationParams()) for i in range(n)]
)
print("finished")
"""


def test_kill_9_keeps_the_completed_entries_and_a_rerun_requests_only_the_rest(
    tmp_path: Path,
) -> None:
    n = 24
    path = tmp_path / "llm_cache.sqlite"
    requests = [ask(f"question {i}") for i in range(n)]
    with FakeOpenAIServer([Reply(delay=0.15)]) as server:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUN, server.base_url, str(path), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while server.requests < 8 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
        assert b"finished" not in stdout
        sent_before_kill = server.requests

        con = sqlite3.connect(path)
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored = con.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
        con.close()
        assert 0 < stored < n, f"{stored} of {n} stored: the kill came too early or too late"
        assert stored <= sent_before_kill

        llm = CachedLLM(OpenAILLM("fake-model", base_url=server.base_url, concurrency=4), path)
        out = llm.generate_batch(requests)
        llm.close()
        assert server.requests - sent_before_kill == n - stored
    assert [c.text for c in out] == [f"echo: question {i}" for i in range(n)]
    assert sum(c.cached for c in out) == stored
    assert all(c.ok for c in out)


# --- d. the question stage through the real server ---------------------------------------------


def test_synthesize_questions_cli_through_transformers_serve(
    served: ServedModel, proxy: CountingProxy, tmp_path: Path
) -> None:
    """A tiny random model writes garbage: every walk must come back as a reject with a reason
    and the raw output, nothing crashes, and a re-run is served from the cache."""
    import json as jsonlib

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from kgsynth.cli import app
    from kgsynth.kg.embedded import EmbeddedKG
    from kgsynth.kg.profiles import get_profile
    from kgsynth.walk import WalkConfig, run_walks
    from tests.kgfixtures import generated_movie_facts, movie_ntriples

    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    run_walks(kg, WalkConfig(n=6, seed=2), tmp_path / "walks.parquet")
    out = tmp_path / "q" / "questions.parquet"
    args = [
        "synthesize", "questions", "--walks", str(tmp_path / "walks.parquet"), "--out", str(out),
        "--llm", "openai", "--model", served.model, "--base-url", proxy.base_url,
        "--max-tokens", "12", "--concurrency", "3",
    ]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    after_first = proxy.requests  # 6 questions, plus one judge call per question that parsed
    assert after_first >= 6
    manifest = jsonlib.loads((tmp_path / "q" / "questions.manifest.json").read_text())
    assert manifest["llm"]["backend"] == "openai" and manifest["made_by_templates"] is False
    rejected = pq.read_table(tmp_path / "q" / "questions.rejected.parquet").to_pylist()
    accepted = pq.read_table(out).num_rows
    assert accepted + len(rejected) == 6
    assert all(r["reject_reason"] and r["raw_output"] is not None for r in rejected)
    assert sum(manifest["rejects"].values()) == len(rejected)
    second = CliRunner().invoke(app, [*args, "--overwrite"])
    assert second.exit_code == 0, second.output
    assert proxy.requests == after_first  # everything came from the cache
