"""Engine throughput on the CPU with the bundled model, and the scheduler's own cost per step.

    PYTHONPATH=runtime python benchmarks/engine_cpu_bench.py

Decode tokens/s at batch 1 and 16 (greedy, ignore_eos, 64 new tokens, float32), and the time
one schedule()+update() takes with 256 running sequences and no model at all.
"""

from __future__ import annotations

import time

from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.block_manager import BlockManager
from pagoda_runtime.scheduler import Scheduler
from pagoda_runtime.sequence import Sequence, SequenceGroup

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


def main() -> None:
    llm = LLM("smollm2-135m", dtype="float32", device="cpu")
    rows = [
        ("bundled SmolLM2-135M, batch 1, decode", f"{engine_tokens_per_second(llm, 1):.1f} tok/s"),
        ("bundled SmolLM2-135M, batch 16, decode", f"{engine_tokens_per_second(llm, 16):.1f} tok/s"),
        ("scheduler + block manager, 256 running", f"{scheduler_step_seconds() * 1e3:.3f} ms/step"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'what':<{width}}  result")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
