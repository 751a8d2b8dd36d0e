"""Engine throughput on the CPU with the bundled model, and the scheduler's own cost per step.

    .venv/bin/python -m benchmarks.engine_cpu --result-json benchmarks/results/cpu/engine_cpu.json

Decode tokens/s at batch 1 and 16 (greedy, ignore_eos, 64 new tokens, float32), and the time
one schedule()+update() takes with 256 running sequences and no model at all.
"""

from __future__ import annotations

import argparse
import time

from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.bench.results import emit
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.scheduler import Scheduler
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup

NEW_TOKENS = 64


def engine_tokens_per_second(llm: LLM, batch: int) -> float:
    prompts = [f"Write a short story about robot number {i}." for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def scheduler_step_seconds(num_seqs: int = 256, steps: int = 200) -> float:
    block_manager = BlockManager(num_blocks=num_seqs * 64, block_size=16)
    scheduler = Scheduler(block_manager, max_num_seqs=num_seqs, max_num_batched_tokens=8192)
    for i in range(num_seqs):
        group = SequenceGroup(str(i), [i % 100 + 1] * 20 + list(range(i, i + 100)), SamplingParams(), 0.0)
        group.seqs = [Sequence(group, 0)]
        scheduler.add(group.seqs[0])
    while any(
        seq.num_computed_tokens < seq.num_prompt_tokens for seq in [*scheduler.waiting, *scheduler.running]
    ):
        batch = scheduler.schedule()
        scheduler.update(batch)
        for seq in batch.seqs:
            if seq.num_computed_tokens == seq.num_tokens:
                seq.token_ids.append(7)
    start = time.perf_counter()
    for _ in range(steps):
        batch = scheduler.schedule()
        assert len(batch) == num_seqs
        scheduler.update(batch)
        for seq in batch.seqs:
            seq.token_ids.append(7)
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--result-json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    llm = LLM("smollm2-135m", dtype="float32", device="cpu")
    result = {
        "model": "smollm2-135m",
        "device": "cpu",
        "dtype": "float32",
        "new_tokens": NEW_TOKENS,
        "decode_tok_per_s_batch_1": engine_tokens_per_second(llm, 1),
        "decode_tok_per_s_batch_16": engine_tokens_per_second(llm, 16),
        "scheduler_step_s_256_running": scheduler_step_seconds(),
    }
    emit(result, args.result_json)


if __name__ == "__main__":
    main()
