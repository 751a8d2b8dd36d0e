"""Interactive TTFT under a saturating batch load, with and without priority scheduling.

    python -m benchmarks.priority_ttft --out benchmarks/results/cpu/priority_ttft.json
    python -m benchmarks.priority_ttft --model llama-3-8b --load-format dummy --device cuda \
        --kv-cache-memory 8589934592 --out DIR/priority_ttft_llama-3-8b.json   # scripts/gpu-bench.sh

For each policy a `pagoda-runtime serve` child (by default the bundled model on the CPU) first answers
interactive requests alone (idle), then again while closed-loop batch clients keep every place of
the batch taken and more requests queued behind them (loaded). Interactive requests are short
(priority 0, sent one at a time with a pause between them), batch ones long (priority 10, the
lowest). Under fcfs neither sends a priority. TTFT is the time from sending a streamed request to
its first text chunk, measured by the client. The issue's bar: under the priority policy the
loaded interactive TTFT p95 stays within 2x of the idle one. The machine's load average is
recorded before and after, since the CPU is shared; on a machine with more runnable threads than
cores, run it with OMP_NUM_THREADS=1 (the server inherits it): torch's threads otherwise wait on each
other's descheduled peers and a 36-token request takes seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from benchmarks.launched_server import launched_server

ROOT = Path(__file__).resolve().parent.parent
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 10


def _prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(min(100, vocab // 2), vocab) for _ in range(length)]


async def _ttft(client: httpx.AsyncClient, body: dict) -> float:
    """Seconds from sending a streamed completion to its first text chunk; reads it to the end."""
    start = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream ended without text")
    return first


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _summary(ttfts: list[float]) -> dict:
    return {
        "n": len(ttfts),
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
        "ttft_p95_ms": round(1000 * _percentile(ttfts, 0.95), 1),
        "ttft_ms": [round(1000 * t, 1) for t in ttfts],
    }


async def _metric(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def _probes(client, rng, args, priority: int | None, count: int) -> list[float]:
    ttfts = []
    for _ in range(count):
        body = {
            "prompt": _prompt(rng, args.interactive_prompt, args.vocab_size),
            "max_tokens": args.interactive_tokens,
        }
        if priority is not None:
            body["priority"] = priority
        ttfts.append(await _ttft(client, body))
        await asyncio.sleep(args.pause)
    return ttfts


async def _measure(url: str, args, policy: str) -> dict:
    rng = random.Random(args.seed)
    by_priority = policy == "priority"
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        await _probes(client, rng, args, INTERACTIVE_PRIORITY if by_priority else None, 3)  # warm-up
        idle = await _probes(client, rng, args, INTERACTIVE_PRIORITY if by_priority else None, args.probes)

        stop = asyncio.Event()
        batch_done = []

        async def batch_client() -> None:
            while not stop.is_set():
                body = {
                    "prompt": _prompt(rng, args.batch_prompt, args.vocab_size),
                    "max_tokens": args.batch_tokens,
                    "ignore_eos": True,
                }
                if by_priority:
                    body["priority"] = BATCH_PRIORITY
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.post("/v1/completions", json=body)
                    if response.status_code == 200:
                        batch_done.append(time.perf_counter())

        workers = [asyncio.create_task(batch_client()) for _ in range(args.batch_clients)]
        # Saturated and in its steady state: a batch request has finished (so the batch's
        # requests are at staggered points, not all in their first prefill), every place of the
        # batch is taken and requests are queued behind them.
        deadline = time.monotonic() + 600
        while (
            not batch_done
            or await _metric(client, "pagoda_num_requests_running") < args.max_num_seqs
            or await _metric(client, "pagoda_num_requests_waiting") < 1
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the batch load did not saturate the server within 600 s")
            await asyncio.sleep(0.2)
        started = time.perf_counter()
        probes = args.probes if by_priority else args.fcfs_probes
        loaded = await _probes(client, rng, args, INTERACTIVE_PRIORITY if by_priority else None, probes)
        elapsed = time.perf_counter() - started
        waiting = await _metric(client, "pagoda_num_requests_waiting")
        preemptions = await _metric(client, "pagoda_num_preemptions_total")
        stop.set()
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    idle_summary, loaded_summary = _summary(idle), _summary(loaded)
    return {
        "policy": policy,
        "idle": idle_summary,
        "loaded": loaded_summary,
        "loaded_over_idle_p50": round(loaded_summary["ttft_p50_ms"] / idle_summary["ttft_p50_ms"], 2),
        "loaded_over_idle_p95": round(loaded_summary["ttft_p95_ms"] / idle_summary["ttft_p95_ms"], 2),
        "batch_requests_completed_while_probing": sum(1 for t in batch_done if t >= started),
        "probing_s": round(elapsed, 1),
        "waiting_at_end": waiting,
        "preemptions": preemptions,
    }


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def _device_name(device: str) -> str:
    if device == "cpu":
        return f"CPU: {_cpu_name()}, {os.cpu_count()} cores"
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    with contextlib.suppress(OSError):
        return subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip() or device
    return device


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu/priority_ttft.json")
    parser.add_argument("--policies", nargs="+", default=["priority", "fcfs"], choices=["priority", "fcfs"])
    parser.add_argument(
        "--model", default="smollm2-135m", help="the served model, or a shape with dummy weights"
    )
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-memory", type=int, default=256 * 2**20, help="bytes")
    parser.add_argument(
        "--vocab-size", type=int, default=49152, help="random prompt ids stay below it (SmolLM2's)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=8192,
        help="the server's step budget (its default 8192); lower bounds how long one step runs",
    )
    parser.add_argument("--batch-clients", type=int, default=16, help="closed-loop batch clients")
    parser.add_argument("--batch-prompt", type=int, default=128, help="tokens")
    parser.add_argument("--batch-tokens", type=int, default=64, help="output tokens of a batch request")
    parser.add_argument("--interactive-prompt", type=int, default=32, help="tokens")
    parser.add_argument("--interactive-tokens", type=int, default=4)
    parser.add_argument("--probes", type=int, default=20, help="interactive requests per phase")
    parser.add_argument("--fcfs-probes", type=int, default=6, help="loaded interactive requests under fcfs")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between interactive requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    uptime_before = _uptime()
    results = []
    for policy in args.policies:
        flags = [
            "--model",
            args.model,
            "--load-format",
            args.load_format,
            "--device",
            args.device,
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--max-num-batched-tokens",
            str(args.max_num_batched_tokens),
            "--max-model-len",
            "512",
            "--kv-cache-memory",
            str(args.kv_cache_memory),
            "--scheduling-policy",
            policy,
        ]
        log_path = args.out.with_name(f"{args.out.stem}-{policy}.log")
        with launched_server(flags, log_path, args.ready_timeout) as url:
            result = asyncio.run(_measure(url, args, policy))
        result["serve_flags"] = flags
        results.append(result)
        log_path.unlink(missing_ok=True)
        print(json.dumps({k: v for k, v in result.items() if k not in ("idle", "loaded")}), flush=True)
    priority = next((r for r in results if r["policy"] == "priority"), None)
    report = {
        "command": " ".join(["python -m benchmarks.priority_ttft", *sys.argv[1:]]),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": _device_name(args.device),
        "model": args.model,
        # What benchmarks.targets judges the figure by: a shape's bound holds for that shape only.
        "shape": args.model if args.load_format == "dummy" else None,
        "uptime_before": uptime_before,
        "uptime_after": _uptime(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "bar": "priority policy: loaded interactive TTFT p95 <= 2x idle",
        "bar_met": None if priority is None else priority["loaded_over_idle_p95"] <= 2.0,
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
