"""Batched LoRA (kernels/triton_lora.py) on Llama-3-8B's projections: what the adapters add to each
bf16 base projection, decode (default: 32 tokens of 4 adapters of rank 16) and prefill (--prefill:
2048 tokens of 4 adapters of rank 64).

Each time is the median of a CUDA graph that cycles several copies of the base weights (and of the
adapters), so the 50 MB L2 cannot hold them: the base projection alone, then the base projection
followed by add_lora (shrink and expand). The step's lora_batch (once per step, for every layer)
is timed alone. Reported: per projection the base and LoRA times and the LoRA overhead; for 32
layers, the overhead over the projections' time (the whole step also has attention, norms and the
LM head, so the model's overhead is smaller than this). --smoke runs tiny projections (on the CPU
through Triton's interpreter where there is no GPU: a check of this script, not a timing).

    .venv/bin/python -m benchmarks.lora_kernels [--check] [--sweep] [--prefill] [--smoke]
        [--result-json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch
import torch.nn.functional as F

from benchmarks.kernel_timing import (
    bench_device,
    bench_dtype,
    device_name,
    graph_seconds,
    relative_error,
)
from pagoda_runtime.bench.results import emit
from pagoda_runtime.executor.kernels.lora_reference import reference_add_lora
from pagoda_runtime.executor.kernels.lora_slots import LoraBatch, lora_batch
from pagoda_runtime.executor.kernels.triton_lora import add_lora, lora_expand, lora_shrink

# (input width, output parts) of one Llama-3-8B layer's projections, fused as the model fuses them.
LLAMA3_8B = {
    "qkv": (4096, (4096, 1024, 1024)),
    "o": (4096, (4096,)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}
SMOKE = {"qkv": (64, (64, 32, 32)), "down": (96, (64,))}
LAYERS = 32
SLOTS = 4
STREAM_BYTES = 128 * 2**20


def bench_projection(
    name: str, in_features: int, parts: tuple[int, ...], batch: LoraBatch, rank: int, args, device
) -> dict:
    tokens = batch.num_tokens
    out_features = sum(parts)
    copies = (
        max(1, math.ceil(STREAM_BYTES / (out_features * in_features * 2))) if device.type == "cuda" else 1
    )
    dtype = bench_dtype(device)
    weights = [torch.randn(out_features, in_features, device=device).to(dtype) * 0.02 for _ in range(copies)]
    adapters = [
        (
            torch.randn(len(parts), SLOTS, rank, in_features, device=device).to(dtype) * 0.02,
            torch.randn(SLOTS, out_features, rank, device=device).to(dtype) * 0.02,
        )
        for _ in range(copies)
    ]
    scaling = torch.full((SLOTS,), 2.0, device=device)
    x = torch.randn(tokens, in_features, device=device, dtype=dtype)
    if args.check:
        base = F.linear(x, weights[0])
        out = add_lora(base.clone(), x, batch, *adapters[0], scaling, parts)
        ref = reference_add_lora(base.clone(), x, batch.token_slots, *adapters[0], scaling, parts)
        err = relative_error(out, ref)
        print(f"check {name} tokens {tokens} rank {rank}: rel err {err:.2e}")
        if err > 2e-3:
            raise SystemExit(f"CHECK FAILED: {name}: {err:.2e}")

    def with_lora(w, a, split_k=None, block_n=128):
        y = lora_shrink(x, a[0], batch, scaling, split_k=split_k)
        return lora_expand(y, a[1], batch, F.linear(x, w), parts, block_n=block_n)

    pairs = list(zip(weights, adapters, strict=True))
    base_seconds = graph_seconds([lambda w=w: F.linear(x, w) for w in weights], device)
    lora_seconds = graph_seconds([lambda w=w, a=a: with_lora(w, a) for w, a in pairs], device)
    row = {
        "projection": name,
        "tokens": tokens,
        "rank": rank,
        "base_us": base_seconds * 1e6,
        "base_plus_lora_us": lora_seconds * 1e6,
        "lora_us": (lora_seconds - base_seconds) * 1e6,
        "overhead": lora_seconds / base_seconds - 1,
    }
    if args.sweep:
        timed = {
            (split_k, block_n): graph_seconds(
                [lambda w=w, a=a, s=split_k, n=block_n: with_lora(w, a, s, n) for w, a in pairs], device
            )
            for split_k, block_n in itertools.product((1, 2, 4, 8, 16), (64, 128, 256))
        }
        best = min(timed, key=timed.get)
        row["sweep_best"] = {"split_k": best[0], "block_n": best[1]}
        row["sweep_best_lora_us"] = (timed[best] - base_seconds) * 1e6
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the reference before timing")
    parser.add_argument("--sweep", action="store_true", help="also time shrink split-K and expand tiles")
    parser.add_argument("--prefill", action="store_true", help="2048 tokens of rank-64 adapters")
    parser.add_argument("--smoke", action="store_true", help="tiny projections, to check this script")
    parser.add_argument("--result-json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = bench_device()
    tokens, rank = (2048, 64) if args.prefill else (32, 16)
    tokens = 8 if args.smoke else tokens
    slots = torch.arange(tokens, device=device, dtype=torch.int32) % SLOTS
    batch = lora_batch(slots, SLOTS)
    rows = []
    for name, (in_features, parts) in (SMOKE if args.smoke else LLAMA3_8B).items():
        rows.append(bench_projection(name, in_features, parts, batch, rank, args, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    batch_seconds = graph_seconds([lambda: lora_batch(slots, SLOTS)], device)
    base = sum(r["base_us"] for r in rows) * LAYERS
    lora = sum(r["lora_us"] for r in rows) * LAYERS + batch_seconds * 1e6
    print(f"\ndevice: {device_name(device)}; {tokens} tokens, {SLOTS} adapters of rank {rank}")
    print(f"{'projection':10s} {'base us':>8s} {'+lora us':>9s} {'lora us':>8s} {'overhead':>8s}")
    for r in rows:
        best = f"  sweep best {r['sweep_best']}: {r['sweep_best_lora_us']:.1f} us" if args.sweep else ""
        print(
            f"{r['projection']:10s} {r['base_us']:8.1f} {r['base_plus_lora_us']:9.1f} {r['lora_us']:8.1f} "
            f"{r['overhead']:8.1%}{best}"
        )
    print(
        f"lora_batch once per step: {batch_seconds * 1e6:.1f} us; {LAYERS} layers: projections "
        f"{base / 1e3:.3f} ms, LoRA {lora / 1e3:.3f} ms, {lora / base:.1%} over the projections"
    )
    result = {
        "device": device_name(device),
        "tokens": tokens,
        "adapters": SLOTS,
        "rank": rank,
        "rows": rows,
        "lora_batch_us": batch_seconds * 1e6,
        "layers": LAYERS,
        "overhead_over_projections": lora / base,
    }
    emit(result, args.result_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
