"""What sending each step's inputs to the other ranks costs (step_broadcast.py), on the CPU with gloo.

Two processes on loopback, as on one machine: rank 0 sends steps of several shapes (decode batches
and prefill chunks, with block tables as wide as a long context makes them), rank 1 receives them;
after each, both ranks join one one-element all-reduce, standing in for the forward's first
collective, so that the time counted is until the other rank has the step. The same all-reduce
alone is the baseline: the overhead of the broadcast is the difference.

    .venv/bin/python -m benchmarks.step_broadcast \
        --result-json benchmarks/results/cpu/step_broadcast.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import UTC, datetime

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pagoda_runtime.bench.results import emit
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.parallel.step_broadcast import StepInputs, StepReceiver, StepSender
from pagoda_runtime.parallel.tensor_parallel import TensorParallel

# (what, sequences, new tokens per sequence, block-table width)
SHAPES = (
    ("decode, batch 1", 1, 1, 256),
    ("decode, batch 16", 16, 1, 256),
    ("decode, batch 256", 256, 1, 256),
    ("prefill, 1 x 512 tokens", 1, 512, 32),
    ("prefill, 16 x 512 tokens", 16, 512, 256),
)


def _step(num_seqs: int, new_tokens: int, width: int) -> StepInputs:
    n = num_seqs * new_tokens
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        query_start_loc=torch.arange(0, n + 1, new_tokens, dtype=torch.int32),
        seq_lens=torch.full((num_seqs,), width * 16, dtype=torch.int32),
        block_tables=torch.arange(num_seqs * width, dtype=torch.int32).reshape(num_seqs, width),
        max_query_len=new_tokens,
        max_seq_len=width * 16,
    )
    rows = torch.arange(new_tokens - 1, n, new_tokens, dtype=torch.int64)
    ids = torch.arange(n, dtype=torch.int64)
    return StepInputs(ids, ids.clone(), meta, rows, True)


def _rank(rank: int, port: int, repeats: int, queue) -> None:
    # One thread each: two ranks share the cores, and an OpenMP region whose second thread waits
    # for a core would be counted as the broadcast's cost.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tp = TensorParallel.joined()
    device = torch.device("cpu")
    ack = torch.zeros(1)
    if rank == 1:
        receiver = StepReceiver(tp, device)
        while receiver.receive() is not None:
            tp.all_reduce(ack)
        for _ in range(repeats):
            tp.all_reduce(ack)
        dist.destroy_process_group()
        return

    def fail(message: str) -> None:
        raise RuntimeError(message)

    sender = StepSender(tp, device, keepalive_s=3600, on_failure=fail)
    rows = []
    for what, num_seqs, new_tokens, width in SHAPES:
        step = _step(num_seqs, new_tokens, width)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            with sender.sending(step):
                tp.all_reduce(ack)
            times.append(time.perf_counter() - started)
        sent = 3 * step.input_ids.shape[0] + 2 * num_seqs + 1 + num_seqs * width + step.logits_rows.shape[0]
        rows.append({"shape": what, "payload_bytes": 8 * sent, "median_us": statistics.median(times) * 1e6})
    sender.stop()
    baseline = []
    for _ in range(repeats):
        started = time.perf_counter()
        tp.all_reduce(ack)
        baseline.append(time.perf_counter() - started)
    queue.put({"rows": rows, "all_reduce_us": statistics.median(baseline) * 1e6})
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args(argv)
    load_before = list(os.getloadavg())
    context = mp.get_context("spawn")
    queue = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, args.port, args.repeats, queue)) for r in (0, 1)]
    for process in ranks:
        process.start()
    measured = queue.get(timeout=600)
    for process in ranks:
        process.join(60)
    baseline = measured["all_reduce_us"]
    for row in measured["rows"]:
        row["overhead_us"] = row["median_us"] - baseline
    emit(
        {
            "benchmark": "step_broadcast",
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "device": f"{os.cpu_count()}-core CPU ({platform.machine()}), gloo over loopback",
            "load_average_before": load_before,
            "torch": torch.__version__,
            "repeats": args.repeats,
            "all_reduce_us": baseline,
            "rows": measured["rows"],
        },
        args.result_json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
