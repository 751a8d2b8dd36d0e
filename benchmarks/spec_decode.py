"""N-gram speculative decoding on the CPU: acceptance rate and speed-up on copy-heavy work.

Text that quotes its context is where prompt lookup pays: a summary quoting its source, an edit
of given code. The bundled model (SmolLM2-135M) decodes such prompts greedily at batch 1, 2, 4 and
8, without speculation and with --speculative-config '{"method": "ngram", ...}' (its
disable_by_batch_size raised past every batch, so that each batch speculates: the largest batch
that still gains is the default cut-off, contract/speculative.py), and this reports
decode tok/s of both, the speed-up, the acceptance rate (accepted / drafted tokens) and the mean
tokens each verify step emitted; the outputs are checked identical (greedy is lossless). Each
batch runs plain and speculative alternately `--repeats` times and keeps each one's fastest run
(the prompts' prefixes are cached after the first, so that is mostly decode); the load average
before and after is recorded: the figures mean little on a busy machine. On a shared machine run it
with OMP_NUM_THREADS=1: OpenMP threads that wait for each other on oversubscribed cores make
steps ten times slower at random, which no ratio survives.

    .venv/bin/python -m benchmarks.spec_decode --result-json benchmarks/results/cpu/spec_decode.json
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import UTC, datetime

import torch

from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.bench.results import emit

PASSAGE = (
    "The Amazon rainforest covers much of the Amazon basin of South America. The basin "
    "encompasses seven million square kilometres, of which five and a half million are covered by "
    "the rainforest. The region includes territory belonging to nine nations. The majority of the "
    "forest is contained within Brazil, with sixty percent of the rainforest, followed by Peru with "
    "thirteen percent and Colombia with ten percent."
)
CODE = (
    "def total_price(items, tax_rate):\n"
    "    subtotal = 0\n"
    "    for item in items:\n"
    "        subtotal += item.price * item.quantity\n"
    "    tax = subtotal * tax_rate\n"
    "    return subtotal + tax\n"
)
# Summarize-and-quote and code-edit prompts; batch 8 cycles through them.
PROMPTS = [
    f"Article:\n{PASSAGE}\n\nQuote the article's second and third sentences word for word:\n",
    f"{CODE}\n# The same function with the parameter tax_rate renamed to rate:\n",
    f"Article:\n{PASSAGE}\n\nSummary, quoting the article where possible:\n",
    f"{CODE}\n# The same function, with a docstring added:\n",
]
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
    "disable_by_batch_size": 256,
}


def run(llm: LLM, prompts: list[str], max_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    return seconds, [o.outputs[0].token_ids for o in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens decoded per prompt")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternating runs per batch; the fastest counts"
    )
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    plain = LLM("smollm2-135m", device="cpu")
    speculative = LLM("smollm2-135m", device="cpu", speculative_config=NGRAM)
    run(plain, PROMPTS[:1], 4)  # warm-up: first-call allocations out of the timings
    run(speculative, PROMPTS[:1], 4)
    rows = []
    for batch in args.batches:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        base_s = spec_s = float("inf")
        for _ in range(args.repeats):
            seconds, expected = run(plain, prompts, args.max_tokens)
            base_s = min(base_s, seconds)
            before = speculative.engine.stats().spec_decode
            seconds, got = run(speculative, prompts, args.max_tokens)
            spec_s = min(spec_s, seconds)
            after = speculative.engine.stats().spec_decode
        drafts = after.num_drafts - before.num_drafts
        drafted = after.num_draft_tokens - before.num_draft_tokens
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
        tokens = batch * args.max_tokens
        rows.append(
            {
                "batch": batch,
                "tokens": tokens,
                "plain_tok_s": tokens / base_s,
                "speculative_tok_s": tokens / spec_s,
                "speed_up": base_s / spec_s,
                "drafts": drafts,
                "draft_tokens": drafted,
                "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafted if drafted else None,
                "tokens_per_verify_step": (accepted + drafts) / drafts if drafts else None,
                "outputs_identical": got == expected,
            }
        )
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "model": "smollm2-135m",
        "speculative_config": NGRAM,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    emit(result, args.result_json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
