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

--structured: JSON records to copy, each request constrained by the records' JSON schema (structured
output speculates too: drafts cut where the grammar refuses, verify rows masked by it).

On a GPU, --shape runs a random-weight model of a named shape instead (Llama-3-8B in the GPU
script), on token-id prompts that quote a random passage, and --draft-model adds a draft-model row
(a shape name: random weights too). Random weights decide nothing about acceptance, which is
whatever such a model's output gives, so each row also gives the milliseconds per target step:
with the plain step's, they give the speed-up at any acceptance rate (tokens per verify step over
the step's cost in plain steps), e.g. at the rate measured on the CPU with real weights.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime

import torch

from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.bench.results import emit
from pagoda_runtime.contract.model_catalogue import shape_config
from pagoda_runtime.engine.structured_outputs import StructuredOutputs

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
DRAFT = {"num_speculative_tokens": 4, "disable_by_batch_size": 256}
# --structured: a record to copy under its schema (JSON mode on a copy-heavy task: tool calls that
# repeat their arguments, extraction that quotes its source).
RECORD_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "city": {"type": "string"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "city", "email", "tags"],
    "additionalProperties": False,
}
RECORDS = [
    {"name": "Ada Lovelace", "city": "London", "email": "ada@example.org", "tags": ["math", "engines"]},
    {"name": "Alan Turing", "city": "Manchester", "email": "alan@example.org", "tags": ["logic", "codes"]},
    {"name": "Grace Hopper", "city": "New York", "email": "grace@example.org", "tags": ["compilers"]},
    {"name": "Edsger Dijkstra", "city": "Austin", "email": "edsger@example.org", "tags": ["paths"]},
]
JSON_PROMPTS = [
    f"Record:\n{json.dumps(record)}\n\nThe same record as JSON, copied exactly:\n" for record in RECORDS
]


def run(
    llm: LLM, prompts: list, max_tokens: int, constraint: StructuredOutputs | None = None
) -> tuple[float, list[list[int]]]:
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, structured_outputs=constraint
    )
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    return seconds, [o.outputs[0].token_ids for o in outputs]


def shape_prompts(shape: str, count: int) -> list[list[int]]:
    """Token-id prompts for a random-weight model: a random passage, then its start again to quote."""
    generator = torch.Generator().manual_seed(0)
    vocab = shape_config(shape).architecture.vocab_size
    prompts = []
    for _ in range(count):
        passage = torch.randint(vocab, (96,), generator=generator).tolist()
        prompts.append(passage + passage[:16])
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens decoded per prompt")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternating runs per batch; the fastest counts"
    )
    parser.add_argument("--shape", help="a random-weight model of this shape instead of the bundled one")
    parser.add_argument("--draft-model", help="also speculate with this draft model (with --shape: a shape)")
    parser.add_argument(
        "--structured",
        action="store_true",
        help="JSON records to copy, each request constrained by the records' JSON schema",
    )
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    if args.shape:
        model, engine_args = args.shape, {"load_format": "dummy", "max_model_len": 512}
        prompts_of = shape_prompts(args.shape, max(args.batches))
    else:
        model, engine_args = "smollm2-135m", {"device": "cpu"}
        prompts_of = JSON_PROMPTS if args.structured else PROMPTS
    args.constraint = StructuredOutputs(json=json.dumps(RECORD_SCHEMA)) if args.structured else None
    proposers = {"ngram": NGRAM}
    if args.draft_model:
        proposers["draft_model"] = {**DRAFT, "model": args.draft_model}
    plain = LLM(model, **engine_args)
    run(plain, prompts_of[:1], 4)  # warm-up: first-call allocations out of the timings
    rows = []
    for name, config in proposers.items():
        speculative = LLM(model, speculative_config=config, **engine_args)
        run(speculative, prompts_of[:1], 4)
        for batch in args.batches:
            rows.append({"proposer": name, **compare(plain, speculative, prompts_of, batch, args)})
        del speculative
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "device": str(plain.engine.runner.device),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "model": model,
        "random_weights": bool(args.shape),
        "speculative_configs": proposers,
        "json_schema": RECORD_SCHEMA if args.structured else None,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    emit(result, args.result_json)
    return 0


def compare(plain: LLM, speculative: LLM, prompts_of: list, batch: int, args) -> dict:
    """One batch decoded plain and speculatively, alternately; the fastest run of each counts."""
    prompts = [prompts_of[i % len(prompts_of)] for i in range(batch)]
    base_s = spec_s = float("inf")
    for _ in range(args.repeats):
        seconds, expected = run(plain, prompts, args.max_tokens, args.constraint)
        base_s = min(base_s, seconds)
        before = speculative.engine.stats().spec_decode
        seconds, got = run(speculative, prompts, args.max_tokens, args.constraint)
        spec_s = min(spec_s, seconds)
        after = speculative.engine.stats().spec_decode
    drafts = after.num_drafts - before.num_drafts
    drafted = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    tokens = sum(map(len, expected))  # a completed JSON value ends its request before max_tokens
    # Each target step emits one token per sequence plus what it accepted (the prefill's included).
    spec_steps = (tokens - accepted) / batch
    return {
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
        "plain_ms_per_step": 1000 * base_s * batch / tokens,
        "speculative_ms_per_step": 1000 * spec_s / spec_steps,
        "outputs_identical": got == expected,
    }


if __name__ == "__main__":
    raise SystemExit(main())
