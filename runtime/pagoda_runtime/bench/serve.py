"""A serving load test in the style of vLLM's benchmark_serving.

Requests arrive as a Poisson process at --request-rate (all at once when it is inf), each with a
random prompt of exactly --random-input-len token ids and a completion of exactly
--random-output-len tokens (ignore_eos), streamed from /v1/completions. Per request it measures
time to first token (TTFT), the gaps between streamed chunks (ITL), time per output token after
the first (TPOT) and end-to-end latency; over the run, throughput.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx

from pagoda_runtime.bench.stats import percentiles


@dataclass(frozen=True)
class BenchConfig:
    base_url: str
    model: str | None = None
    num_prompts: int = 100
    request_rate: float = math.inf
    max_concurrency: int | None = None
    input_len: int = 128
    output_len: int = 64
    vocab_size: int = 8000
    seed: int = 0
    api_key: str | None = None
    result_json: str | None = None


@dataclass
class RequestResult:
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)


async def _one(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(ok=False)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not any(c.get("text") for c in chunk.get("choices", ())):
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = True
    return result


async def _run(config: BenchConfig) -> dict:
    rng = random.Random(config.seed)
    prompts = [
        [rng.randrange(config.vocab_size) for _ in range(config.input_len)] for _ in range(config.num_prompts)
    ]
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=config.base_url, headers=headers, timeout=None, limits=limits
    ) as client:
        model = config.model
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        gate = asyncio.Semaphore(config.max_concurrency or config.num_prompts)

        async def limited(prompt: list[int]) -> RequestResult:
            async with gate:
                return await _one(client, model, prompt, config.output_len)

        tasks = []
        start = time.perf_counter()
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if config.request_rate != math.inf:
                await asyncio.sleep(rng.expovariate(config.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return _summary(config, model, results, duration)


def _summary(config: BenchConfig, model: str, results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        # JSON has no Infinity; an unlimited rate is written the way it is given on the command line.
        "config": {
            **{k: v for k, v in asdict(config).items() if k != "api_key"},
            "request_rate": "inf" if math.isinf(config.request_rate) else config.request_rate,
        },
        "model": model,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "ttft_s": percentiles([r.ttft for r in done]),
        "tpot_s": percentiles(tpot),
        "itl_s": percentiles([gap for r in done for gap in r.itl]),
        "e2e_s": percentiles([r.e2e for r in done]),
    }


def _print(summary: dict) -> None:
    print(f"{'model':<28}{summary['model']}")
    print(f"{'completed / failed':<28}{summary['completed']} / {summary['failed']}")
    for error in summary["errors"]:
        print(f"{'  error':<28}{error}")
    print(f"{'duration (s)':<28}{summary['duration_s']:.2f}")
    print(f"{'input / output tokens':<28}{summary['total_input_tokens']} / {summary['total_output_tokens']}")
    print(f"{'request throughput (req/s)':<28}{summary['request_throughput']:.2f}")
    print(f"{'output throughput (tok/s)':<28}{summary['output_throughput']:.2f}")
    print(f"{'(ms)':<12}{'mean':>10}{'p50':>10}{'p95':>10}{'p99':>10}")
    for name in ("ttft", "tpot", "itl", "e2e"):
        row = summary[f"{name}_s"]
        print(
            f"{name.upper():<12}" + "".join(f"{row[k] * 1000:>10.1f}" for k in ("mean", "p50", "p95", "p99"))
        )


def run(config: BenchConfig) -> int:
    summary = asyncio.run(_run(config))
    _print(summary)
    if config.result_json:
        with open(config.result_json, "w") as f:
            json.dump(summary, f, indent=2)
    if summary["failed"]:
        print(f"{summary['failed']} requests failed", file=sys.stderr)
        return 1
    return 0
