"""`longsparse bench serve`: a load generator for an OpenAI-compatible server, in the style of vLLM's serving
benchmark.

Requests of ``--prompt-len`` random token ids (seeded) ask for exactly ``--output-len`` tokens (``ignore_eos``), sent
at ``--request-rate`` (Poisson arrivals; ``inf``: all at once) with at most ``--max-concurrency`` in flight, and
streamed: time to first token (TTFT), time per output token after the first (TPOT), inter-token latency (ITL),
end-to-end latency and throughput, as JSON. ``--compare-sequential`` runs the same prompts one at a time first and
records ``summary.concurrent_vs_sequential_<N>``: the concurrent run's duration over the sequential one's.

Without ``--base-url`` it starts ``longsparse serve MODEL`` on a free loopback port with the given engine flags and
stops it afterwards. The machine's load average before and after each run is recorded: on a shared CPU it says how
far the timings can be trusted.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._optional import require
from ..reports.results import BenchmarkResult


def configure(parser) -> None:
    parser.add_argument("--base-url", default=None, help="a running server (default: start `longsparse serve`)")
    parser.add_argument("--model", default="default", help="MODEL of the server this benchmark starts")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens (random ids)")
    parser.add_argument("--output-len", type=int, default=64, help="tokens generated per request")
    parser.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests per second, Poisson (default: all at once)"
    )
    parser.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    parser.add_argument(
        "--compare-sequential",
        action="store_true",
        help="also run the same prompts one at a time, first, and record the concurrent / sequential duration",
    )
    parser.add_argument(
        "--token-range",
        type=int,
        nargs=2,
        default=(256, 10000),
        metavar=("LOW", "HIGH"),
        help="prompt token ids are drawn from [LOW, HIGH) (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="serve", help="result file name under OUT/results (default: %(default)s)")
    parser.add_argument(
        "--server-timeout", type=float, default=900.0, help="seconds to wait for a started server to be healthy"
    )
    for flag, kind in (("--max-model-len", int), ("--max-num-seqs", int), ("--max-num-batched-tokens", int),
                       ("--threads", int), ("--dtype", str), ("--device", str), ("--attention", str),
                       ("--gdn", str)):  # fmt: skip
        parser.add_argument(flag, type=kind, default=None, help=f"{flag} of the server this benchmark starts")


@dataclass
class RequestResult:
    """One request's timings (seconds from its send) and token counts; ``error`` if it failed."""

    prompt_tokens: int
    output_tokens: int = 0
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def random_prompts(n: int, length: int, token_range: tuple[int, int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low, high = token_range
    return [[rng.randrange(low, high) for _ in range(length)] for _ in range(n)]


async def _one_request(client, url: str, body: dict) -> RequestResult:
    result = RequestResult(prompt_tokens=len(body["prompt"]))
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[len("data: ") :])
                if "error" in data:
                    result.error = data["error"].get("message", str(data["error"]))
                    return result
                if data.get("usage"):
                    result.output_tokens = data["usage"]["completion_tokens"]
                if not data.get("choices"):
                    continue
                now = time.perf_counter()
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
    except Exception as exc:  # noqa: BLE001 - a failed request is a row of the result, not the end of the run
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    return result


async def run_load(
    base_url: str, model: str, prompts: list[list[int]], output_len: int, request_rate: float,
    max_concurrency: int | None, seed: int,
) -> tuple[list[RequestResult], float]:  # fmt: skip
    """Send ``prompts`` (Poisson arrivals at ``request_rate``, at most ``max_concurrency`` in flight); the results in
    prompt order and the whole run's duration."""
    httpx = require("httpx", "longsparse bench serve")
    rng = random.Random(seed)
    url = base_url.rstrip("/") + "/v1/completions"
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=max(len(prompts), 1))

    async def send(client, prompt: list[int]) -> RequestResult:
        body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
        if gate is None:
            return await _one_request(client, url, body)
        async with gate:
            return await _one_request(client, url, body)

    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.ensure_future(send(client, prompt)))
            if math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def _percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] * scale

    return {"mean": sum(ordered) / len(ordered) * scale, "median": pick(0.5), "p99": pick(0.99)}


def summarize(results: list[RequestResult], duration: float) -> dict:
    """vLLM's serving metrics of one run (times in ms, throughputs per second)."""
    done = [r for r in results if r.error is None]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1 and r.ttft is not None]
    row = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
    }
    for name, values in (
        ("ttft", [r.ttft for r in done if r.ttft is not None]),
        ("tpot", tpot),
        ("itl", [t for r in done for t in r.itl]),
        ("e2el", [r.latency for r in done]),
    ):
        for stat, value in _percentiles(values).items():
            row[f"{stat}_{name}_ms"] = value
    errors = sorted({r.error for r in results if r.error is not None})
    if errors:
        row["errors"] = errors[:5]
    return row


def summary_of(rows: list[dict]) -> dict:
    """Headline figures of a run's rows: the concurrent run's throughput and median latencies and, with a
    sequential run, ``concurrent_vs_sequential_<N>`` (duration ratio) and ``sequential_ttft_share`` (the sequential
    run's summed time to first token over its duration: the prompts' prefill, which batching does not shorten, so
    roughly the lowest ratio batching can reach)."""
    by_run = {r["run"]: r for r in rows}
    concurrent = by_run["concurrent"]
    summary = {key: concurrent[key] for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms")}
    if "sequential" in by_run:
        sequential = by_run["sequential"]
        summary[f"concurrent_vs_sequential_{concurrent['num_prompts']}"] = (
            concurrent["duration_s"] / sequential["duration_s"]
        )
        if sequential["mean_ttft_ms"] is not None:
            ttft_total = sequential["mean_ttft_ms"] / 1000 * sequential["completed"]
            summary["sequential_ttft_share"] = ttft_total / sequential["duration_s"]
    return summary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str, list[str]]:
    """``longsparse serve`` on a free loopback port with the engine flags given; waits until it is healthy."""
    httpx = require("httpx", "longsparse bench serve")
    port = _free_port()
    command = [sys.executable, "-m", "longsparse.cli", "serve", args.model, "--port", str(port),
               "--uvicorn-log-level", "warning"]  # fmt: skip
    for flag in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "threads", "dtype", "device",
                 "attention", "gdn"):  # fmt: skip
        value = getattr(args, flag)
        if value is not None:
            command += [f"--{flag.replace('_', '-')}", str(value)]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.server_timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}: {' '.join(command)}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url, command
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.terminate()
            raise RuntimeError(f"the server was not healthy after {args.server_timeout:.0f} s")
        time.sleep(1)


def run(args) -> int:
    httpx = require("httpx", "longsparse bench serve")
    for name in ("num_prompts", "prompt_len", "output_len"):
        if getattr(args, name) <= 0:
            print(f"error: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    low, high = args.token_range
    if not 0 <= low < high:
        print(f"error: --token-range needs 0 <= LOW < HIGH, got {low} {high}", file=sys.stderr)
        return 2
    process = None
    result = BenchmarkResult(args.name)
    try:
        if args.base_url is None:
            process, url, command = start_server(args)
            result.environment["server_command"] = " ".join(command[1:])
        else:
            url = args.base_url.rstrip("/")
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        prompts = random_prompts(args.num_prompts, args.prompt_len, tuple(args.token_range), args.seed)
        warmup = random_prompts(1, min(args.prompt_len, 16), tuple(args.token_range), args.seed + 1)
        asyncio.run(run_load(url, model, warmup, 2, math.inf, None, args.seed))
        concurrency = args.max_concurrency or args.num_prompts
        runs = ([("sequential", 1)] if args.compare_sequential else []) + [("concurrent", concurrency)]
        for label, limit in runs:
            load_before = os.getloadavg()
            results, duration = asyncio.run(
                run_load(url, model, prompts, args.output_len, args.request_rate, limit, args.seed)
            )
            row = result.add(
                run=label, max_concurrency=limit, num_prompts=args.num_prompts,
                request_rate=args.request_rate if math.isfinite(args.request_rate) else "inf",
                prompt_len=args.prompt_len, output_len=args.output_len, **summarize(results, duration),
                load_average_before=list(load_before), load_average_after=list(os.getloadavg()),
            )  # fmt: skip
            print(
                f"{label}: {row['completed']}/{args.num_prompts} requests in {duration:.1f} s, "
                f"TTFT median {row['median_ttft_ms']} ms, TPOT median {row['median_tpot_ms']} ms",
                file=sys.stderr,
            )
    finally:
        if process is not None:
            process.terminate()
            process.wait(60)
    result.summary = summary_of(result.rows)
    result.notes.append(
        f"{os.cpu_count()} CPUs seen; load averages (1, 5, 15 min) before and after each run are in its row: other "
        "processes on a shared machine slow both runs and make the ratio noisy"
    )
    path = result.save(Path(args.out) / "results")
    print(json.dumps(result.summary, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r["failed"] == 0 for r in result.rows) else 1
