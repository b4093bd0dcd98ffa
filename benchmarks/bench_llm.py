"""Requests/s of the openai backend against a local server with a fixed latency, and a cached re-run.

A fixed-latency server -> a printed table and ``benchmarks/results/llm.json``::

    .venv/bin/python benchmarks/bench_llm.py                       # L = 200 ms, C = 32, N = 640
    .venv/bin/python benchmarks/bench_llm.py --latency-ms 100 --concurrency 64 --requests 1280

The server is :class:`tests.llm_servers.FakeOpenAIServer` in its own process (so it never
competes with the client for the GIL): every ``/v1/chat/completions`` sleeps ``L`` and returns
the same completion, on a thread per connection, with keep-alive and a deep accept queue. With
``C`` requests in flight the best any client can do is ``C / L`` requests/s; the target for
:class:`OpenAILLM` is at least 0.9 of that. The script times, on the same server:

1. the server alone: ``C`` threads, each a keep-alive ``http.client`` connection, ``N``
   requests in all (shows the server sustains ``C`` concurrent requests);
2. ``OpenAILLM(concurrency=C).generate_batch`` of ``N`` distinct requests;
3. the same requests through :class:`CachedLLM` with an empty cache (backend + SQLite writes);
4. the same again with the now warm cache: its time, and the requests that reached the
   server (counted by the server itself; must be 0).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from benchmarks.bench_kg_tools import machine_info  # noqa: E402
from kgsynth.llm.base import Completion, GenerationParams, Request  # noqa: E402
from kgsynth.llm.cache import CachedLLM  # noqa: E402
from kgsynth.llm.openai_backend import OpenAILLM  # noqa: E402
from tests.llm_servers import (  # noqa: E402
    STATS_PATH,
    Reply,
    chat_completion,
    fetch_json,
    serve_fake_forever,
    wait_until_answering,
)
from tests.servers import free_port  # noqa: E402

TARGET_RATIO = 0.9
MODEL = "fake-model"
ANSWER = chat_completion(
    '<think>Kismet (1955) was directed by Vincente Minnelli.</think><answer>["Vincente Minnelli"]</answer>',
    prompt_tokens=48,
    completion_tokens=24,
)


def make_requests(n: int) -> list[Request]:
    """``n`` distinct requests (distinct cache keys), shaped like a question-synthesis call."""
    system = {
        "role": "system",
        "content": "Write one natural question whose answer is the path's end.",
    }
    return [
        Request.make(
            [system, {"role": "user", "content": f"Path {i}: Kismet_{i} -directed_by-> ?"}],
            GenerationParams(temperature=0.7, max_tokens=128, seed=i),
        )
        for i in range(n)
    ]


def server_requests(port: int) -> int:
    return int(fetch_json(f"http://127.0.0.1:{port}{STATS_PATH}")["requests"])


def server_max_in_flight(port: int) -> int:
    return int(fetch_json(f"http://127.0.0.1:{port}{STATS_PATH}")["max_in_flight"])


def time_server_alone(port: int, n: int, concurrency: int) -> float:
    """Seconds for ``n`` requests from ``concurrency`` threads on keep-alive connections."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    ).encode()
    headers = {"Content-Type": "application/json"}
    errors: list[str] = []

    def worker(count: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            for _ in range(count):
                conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    errors.append(f"HTTP {resp.status}")
        except OSError as exc:
            errors.append(str(exc))
        finally:
            conn.close()

    shares = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
    threads = [threading.Thread(target=worker, args=(k,)) for k in shares]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"the server alone failed {len(errors)} requests: {errors[:3]}")
    return seconds


def phase(
    name: str,
    seconds: float,
    n: int,
    ideal: float | None,
    sent: int,
    completions: list[Completion] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    rate = n / seconds
    row: dict[str, Any] = {
        "phase": name,
        "requests": n,
        "seconds": round(seconds, 3),
        "requests_per_s": round(rate, 1),
        "ideal_requests_per_s": round(ideal, 1) if ideal else None,
        "ratio_to_ideal": round(rate / ideal, 3) if ideal else None,
        "requests_at_server": sent,
    }
    if completions is not None:
        row["errors"] = sum(not c.ok for c in completions)
        row["from_cache"] = sum(c.cached for c in completions)
    row.update(extra)
    return row


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    latency = args.latency_ms / 1000
    n, c = args.requests, args.concurrency
    ideal = c / latency
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    server = ctx.Process(
        target=serve_fake_forever, args=(port, Reply(body=ANSWER, delay=latency)), daemon=True
    )
    server.start()
    phases: list[dict[str, Any]] = []
    try:
        wait_until_answering(
            f"http://127.0.0.1:{port}{STATS_PATH}", time.monotonic() + 30, server.is_alive
        )
        base_url = f"http://127.0.0.1:{port}/v1"
        requests = make_requests(n)

        before = server_requests(port)
        seconds = time_server_alone(port, n, c)
        phases.append(
            phase("server alone (threads)", seconds, n, ideal, server_requests(port) - before)
        )
        print(f"  {phases[-1]['phase']}: {phases[-1]['requests_per_s']} req/s", flush=True)

        llm = OpenAILLM(MODEL, base_url=base_url, concurrency=c, timeout=60, max_retries=2)
        before = server_requests(port)
        started = time.perf_counter()
        out = llm.generate_batch(requests)
        seconds = time.perf_counter() - started
        phases.append(
            phase(
                f"OpenAILLM, concurrency {c}",
                seconds,
                n,
                ideal,
                server_requests(port) - before,
                out,
                retries=llm.stats.retries,
                server_max_in_flight=server_max_in_flight(port),
            )
        )
        print(f"  {phases[-1]['phase']}: {phases[-1]['requests_per_s']} req/s", flush=True)
        reference = [(x.text, x.finish_reason, x.prompt_tokens, x.completion_tokens) for x in out]

        cache_path = workdir / "llm_cache.sqlite"
        cached = CachedLLM(
            OpenAILLM(MODEL, base_url=base_url, concurrency=c, timeout=60, max_retries=2),
            cache_path,
        )
        before = server_requests(port)
        started = time.perf_counter()
        cold = cached.generate_batch(requests)
        seconds = time.perf_counter() - started
        phases.append(
            phase("CachedLLM, empty cache", seconds, n, ideal, server_requests(port) - before, cold)
        )
        print(f"  {phases[-1]['phase']}: {phases[-1]['requests_per_s']} req/s", flush=True)
        cached.close()

        warm_llm = CachedLLM(
            OpenAILLM(MODEL, base_url=base_url, concurrency=c, timeout=60, max_retries=2),
            cache_path,
        )
        before = server_requests(port)
        started = time.perf_counter()
        warm = warm_llm.generate_batch(requests)
        seconds = time.perf_counter() - started
        sent = server_requests(port) - before
        same = [(x.text, x.finish_reason, x.prompt_tokens, x.completion_tokens) for x in warm]
        phases.append(
            phase(
                "CachedLLM, warm cache (reopened)",
                seconds,
                n,
                None,
                sent,
                warm,
                speedup_vs_backend=round(phases[1]["seconds"] / seconds, 1),
                identical_to_backend_run=same == reference,
            )
        )
        print(f"  {phases[-1]['phase']}: {phases[-1]['seconds']} s", flush=True)
        warm_llm.close()
    finally:
        server.terminate()
        server.join(10)
        if server.is_alive():
            server.kill()
            server.join(10)

    backend = phases[1]
    return {
        "config": {
            "latency_ms": args.latency_ms,
            "concurrency": c,
            "requests": n,
            "target_ratio": TARGET_RATIO,
        },
        "ideal_requests_per_s": round(ideal, 1),
        "phases": phases,
        "backend_meets_target": backend["ratio_to_ideal"] >= TARGET_RATIO
        and backend["errors"] == 0,
        "warm_rerun_requests_at_server": phases[3]["requests_at_server"],
    }


def print_table(results: dict[str, Any]) -> None:
    cfg = results["config"]
    print(
        f"\nopenai backend vs a {cfg['latency_ms']:g} ms server, C = {cfg['concurrency']}, "
        f"N = {cfg['requests']}: ideal C/L = {results['ideal_requests_per_s']:g} req/s "
        f"(target >= {cfg['target_ratio']:g} x ideal)"
    )
    header = (
        f"{'phase':<34} {'seconds':>8} {'req/s':>8} {'x ideal':>8} {'at server':>10} {'errors':>7}"
    )
    print(header)
    print("-" * len(header))
    for p in results["phases"]:
        ratio = f"{p['ratio_to_ideal']:.3f}" if p["ratio_to_ideal"] is not None else "-"
        errors = str(p.get("errors", "-"))
        print(
            f"{p['phase']:<34} {p['seconds']:>8.3f} {p['requests_per_s']:>8.1f} {ratio:>8} "
            f"{p['requests_at_server']:>10} {errors:>7}"
        )
    backend, warm = results["phases"][1], results["phases"][3]
    print(
        f"backend: {backend['ratio_to_ideal']:.3f} x ideal "
        f"({'meets' if results['backend_meets_target'] else 'MISSES'} the target), "
        f"server saw at most {backend['server_max_in_flight']} in flight; "
        f"warm re-run: {warm['seconds']:.3f}s, {warm['requests_at_server']} requests at the "
        f"server, {warm['speedup_vs_backend']}x faster, identical: {warm['identical_to_backend_run']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=200.0, help="server latency L")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight C")
    parser.add_argument("--requests", type=int, default=640, help="requests per phase N")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/llm.json")
    args = parser.parse_args()
    if args.latency_ms <= 0 or args.concurrency < 1 or args.requests < 1:
        parser.error("--latency-ms must be > 0, --concurrency and --requests >= 1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kgsynth-bench-llm-") as tmp:
        print(f"timing {args.requests} requests per phase…", flush=True)
        measured = run(args, Path(tmp))
    results: dict[str, Any] = {
        "machine": {**machine_info(), "openai": openai.__version__},
        **measured,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out} ({results['elapsed_s']}s)")


if __name__ == "__main__":
    main()
