"""The swap of one LoRA adapter from host memory into a device slot (LoraSlots.load_slot, what the
adapter manager does when a step needs an adapter that is not resident): Llama-3-8B's 32 layers,
an adapter of rank 16 on all seven projections, in bf16, as the slot layout holds it (padded to
--max-lora-rank, so the bytes copied are those of the largest rank). On a GPU the host tensors are
pinned, as the manager keeps them, and the time includes the wait for the copy. The result
records the machine's load average, since a shared CPU's other work dominates a memory-bound
median.

    .venv/bin/python -m benchmarks.lora_swap [--max-lora-rank 16] [--repeats 10] [--result-json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from benchmarks.kernel_timing import bench_device, device_name
from pagoda_runtime.bench.results import emit
from pagoda_runtime.executor.models.lora_layers import LoraProjection, LoraSlots

# (fused projection, input width, output parts) of one Llama-3-8B layer.
LLAMA3_8B = (
    ("qkv_proj", 4096, (4096, 1024, 1024)),
    ("o_proj", 4096, (4096,)),
    ("gate_up_proj", 4096, (14336, 14336)),
    ("down_proj", 14336, (4096,)),
)
LAYERS = 32
SLOTS = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--result-json")
    args = parser.parse_args(argv)
    device = bench_device()
    dtype = torch.bfloat16
    slots = LoraSlots(SLOTS, args.max_lora_rank, device, dtype)
    slots.projections = [
        LoraProjection(slots, layer, name, in_features, parts, device)
        for layer in range(LAYERS)
        for name, in_features, parts in LLAMA3_8B
    ]
    host = []
    for proj in slots.projections:
        a = torch.randn(proj.lora_a[:, 0].shape).to(dtype)
        b = torch.randn(proj.lora_b[0].shape).to(dtype)
        host.append((a.pin_memory(), b.pin_memory()) if device.type == "cuda" else (a, b))
    nbytes = sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in host)
    seconds = []
    for i in range(args.repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        slots.load_slot(i % SLOTS, host, 2.0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first allocates and warms the caches
            seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    print(
        f"device: {device_name(device)}; one adapter of rank {args.max_lora_rank} on Llama-3-8B's "
        f"{LAYERS} layers: {nbytes / 2**20:.1f} MiB, swap {median * 1e3:.2f} ms "
        f"({nbytes / median / 1e9:.1f} GB/s)"
    )
    result = {
        "device": device_name(device),
        "model_shape": "llama-3-8b",
        "layers": LAYERS,
        "max_lora_rank": args.max_lora_rank,
        "dtype": "bfloat16",
        "adapter_bytes": nbytes,
        "repeats": args.repeats,
        "swap_ms_median": median * 1e3,
        "swap_ms_min": min(seconds) * 1e3,
        "swap_gb_per_s": nbytes / median / 1e9,
        # A shared CPU's other work shows in the median: the machine's load while this ran.
        "load_average_1m": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }
    emit(result, args.result_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
