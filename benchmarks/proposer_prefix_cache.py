"""A draft model's own prefix cache: requests that share a long system prompt, with speculation.

    OMP_NUM_THREADS=1 python -m benchmarks.proposer_prefix_cache \
        --result-json benchmarks/results/cpu/proposer_prefix_cache.json

The target's prefix cache spares a request the prefill of a prompt prefix another request ran; the
draft's cache of its own (engine/draft_model_proposer.py) spares the draft the same tokens, which
it otherwise runs through before the request's first draft. For each setting, a fresh engine (the
bundled model with itself as the draft, greedy, so every draft is accepted) serves one request to
fill the caches, then --requests requests one at a time, each the same system prompt of
--system-tokens tokens and a question of its own; the draft's cache is switched off for the
"without" setting (its manager's enable_prefix_caching, as --no-enable-prefix-caching would for
both). Reported per setting: the median latency of those requests (whole generation), and the
prompt tokens the target's and the draft's caches held.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.bench.results import emit

SYSTEM = (
    "You are a careful assistant for a library's catalogue. Answer from the records below, quote "
    "titles exactly, and say when a record is missing. Records: "
)


def system_prompt(llm: LLM, tokens: int) -> list[int]:
    """The system text, then numbered catalogue records, cut at `tokens` token ids."""
    text, n = SYSTEM, 0
    while len(llm.engine.tokenizer.encode(text)) < tokens:
        n += 1
        text += f"record {n}: 'A History of Bridges, volume {n}', shelf {n % 17}, available. "
    return llm.engine.tokenizer.encode(text)[:tokens]


def run(model: str, draft_caching: bool, args: argparse.Namespace) -> dict:
    speculative = {"model": model, "num_speculative_tokens": args.k}
    llm = LLM(model, device="cpu", speculative_config=speculative)
    proposer = llm.engine.scheduler.proposer
    proposer.block_manager.enable_prefix_caching = draft_caching
    system = system_prompt(llm, args.system_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    tokenize = llm.engine.tokenizer.encode
    llm.generate(system + tokenize(" Question 0: which shelf holds volume 3?"), params)
    target, draft = llm.engine.block_manager, proposer.block_manager
    hits_before = (target.prefix_hits, draft.prefix_hits)
    seconds = []
    for i in range(1, args.requests + 1):
        prompt = system + tokenize(f" Question {i}: is volume {i * 7} available?")
        started = time.perf_counter()
        llm.generate(prompt, params)
        seconds.append(time.perf_counter() - started)
    return {
        "draft_prefix_caching": draft_caching,
        "latency_s_median": statistics.median(seconds),
        "latency_s": seconds,
        "target_cached_tokens_per_request": (target.prefix_hits - hits_before[0]) / args.requests,
        "draft_cached_tokens_per_request": (draft.prefix_hits - hits_before[1]) / args.requests,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("-k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--result-json")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    settings = [run(args.model, caching, args) for caching in (True, False)]
    with_cache, without = settings
    for s in settings:
        print(
            f"draft cache {'on ' if s['draft_prefix_caching'] else 'off'}: median "
            f"{s['latency_s_median'] * 1e3:.0f} ms a request; cached tokens a request: target "
            f"{s['target_cached_tokens_per_request']:.0f}, draft {s['draft_cached_tokens_per_request']:.0f}"
        )
    result = {
        "device": "cpu",
        "model": args.model,
        "draft": args.model,
        "num_speculative_tokens": args.k,
        "system_tokens": args.system_tokens,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "settings": settings,
        "latency_ratio_without_over_with": without["latency_s_median"] / with_cache["latency_s_median"],
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": [load_before, os.getloadavg()[0]],
        "date": time.strftime("%Y-%m-%d"),
    }
    emit(result, args.result_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
