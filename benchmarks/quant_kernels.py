"""Decode GEMVs of the Llama-3-8B layer shapes: bf16 (torch) vs int8, int4 and fp8 kernels.

Batch 1 by default; --rows 2 to 4 times a small decode batch, whose rows share each weight tile, so
the time should stay near batch 1's: the weights are streamed once per step, not once per row.

Reports microseconds per GEMV, the bytes each must read over that time (GB/s), the fraction of the
device's measured copy bandwidth, and the per-token time of 32 layers. Weights are random;
several copies of each are cycled inside one CUDA graph so that the 50 MB L2 cannot hold them.

    .venv/bin/python -m benchmarks.quant_kernels [--sweep] [--check] [--rows N]
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch
import triton.testing

from pagoda_runtime.bench.roofline import copy_bandwidth
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8
from pagoda_runtime.executor.quantization.reference import reference_matmul
from pagoda_runtime.executor.quantization.scaled_mm import fp8_scaled_mm, scaled_mm_supported
from pagoda_runtime.executor.quantization.triton_gemm import gemm
from pagoda_runtime.executor.quantization.triton_gemv import GemvConfig, default_gemv_config, gemv

# (name, out_features, in_features) of one Llama-3-8B decoder layer with fused qkv and gate_up.
LLAMA3_8B_SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
LAYERS = 32
QUANTIZERS = {"int8": quantize_int8, "int4": lambda w: quantize_int4(w, 128), "fp8": quantize_fp8}
STREAM_BYTES = 128 * 2**20  # cycle enough weight copies to stream this much per graph replay


def time_per_call(fn_per_copy, copies: int) -> float:
    """Median seconds of one call, from a CUDA graph that runs each weight copy once."""

    def run_all():
        for i in range(copies):
            fn_per_copy(i)

    return triton.testing.do_bench_cudagraph(run_all, rep=20, return_mode="median") / 1e3 / copies


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def check(shapes) -> list[str]:
    """Every CUDA path against the dequantize-then-matmul reference, on fresh random inputs."""
    failures = []
    for (name, n, k), (kind, quantize) in itertools.product(shapes, QUANTIZERS.items()):
        weight = quantize(torch.randn(n, k, device="cuda") * 0.02)
        for rows in (1, 3, 64):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = reference_matmul(x.float(), weight)
            out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            try:
                out.copy_(gemv(x, weight) if rows <= 4 else gemm(x, weight))
            except Exception as error:  # report every failing path, not just the first
                failures.append(f"{name} {kind} rows={rows}: {type(error).__name__}: {error}")
                continue
            err = relative_error(out, ref)
            if kind == "fp8" and rows == 64 and scaled_mm_supported(x, weight):
                scaled = relative_error(fp8_scaled_mm(x, weight), ref)
                print(f"check {name:8s} {kind} rows={rows} scaled_mm rel err {scaled:.2e}")
                if scaled > 5e-2:
                    failures.append(f"{name} fp8 scaled_mm rows={rows}: {scaled:.2e}")
            print(f"check {name:8s} {kind} rows={rows} rel err {err:.2e}")
            if err > 1e-2:
                failures.append(f"{name} {kind} rows={rows}: {err:.2e}")
    return failures


def sweep_configs(kind: str, n: int) -> list[GemvConfig]:
    block_ks = (512, 1024) if kind == "int4" else (256, 512)
    splits = (1, 4) if n <= 8192 else (1,)
    configs = [GemvConfig(bn, bk, s, 4) for bn, bk, s in itertools.product((8, 16, 32), block_ks, splits)]
    return configs + [GemvConfig(32, bk, s, 8) for bk, s in itertools.product(block_ks, splits)]


def bench(sweep: bool, bandwidth: float, batch: int) -> None:
    rows = []
    totals: dict[str, float] = {}
    for name, n, k in LLAMA3_8B_SHAPES:
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        copies = max(1, math.ceil(STREAM_BYTES / dense.nbytes))
        weights = [dense] + [torch.randn_like(dense) * 0.02 for _ in range(copies - 1)]
        t = time_per_call(lambda i, x=x, w=weights: torch.nn.functional.linear(x, w[i]), copies)
        variants = [("bf16", t, dense.nbytes)]
        for kind, quantize in QUANTIZERS.items():
            first = quantize(dense)
            pool = [first] + [
                quantize(torch.randn_like(dense) * 0.02)
                for _ in range(math.ceil(STREAM_BYTES / first.nbytes) - 1)
            ]
            pc = len(pool)
            configs = sweep_configs(kind, n) if sweep else [default_gemv_config(pool[0], batch)]
            best = None
            for config in configs:
                try:
                    tc = time_per_call(lambda i, x=x, p=pool, c=config: gemv(x, p[i], c), pc)
                except Exception as error:  # a config can exceed registers or shared memory
                    print(f"  {name} {kind} {config} failed: {type(error).__name__}")
                    continue
                if sweep:
                    print(f"  {name:8s} {kind} {config} {tc * 1e6:8.2f} us")
                if best is None or tc < best[0]:
                    best = (tc, config)
            variants.append((kind, best[0], pool[0].nbytes))
            if sweep:
                print(f"BEST {name} {kind} {best[1]} {best[0] * 1e6:.2f} us")
            if kind == "fp8":
                ts = time_per_call(lambda i, x=x, p=pool: fp8_scaled_mm(x, p[i]), pc)
                variants.append(("fp8 _scaled_mm", ts, pool[0].nbytes))
        for kind, seconds, nbytes in variants:
            moved = nbytes + x.nbytes + n * 2 * batch
            rows.append((name, kind, seconds, moved / seconds, moved / seconds / bandwidth, t / seconds))
            totals[kind] = totals.get(kind, 0.0) + seconds
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    print(f"\ndevice: {device}, copy bandwidth {bandwidth / 1e9:.0f} GB/s, activation rows {batch}")
    print(f"{'layer':8s} {'variant':15s} {'us':>8s} {'GB/s':>7s} {'of copy':>8s} {'vs bf16':>8s}")
    for name, kind, seconds, rate, fraction, speedup in rows:
        print(f"{name:8s} {kind:15s} {seconds * 1e6:8.2f} {rate / 1e9:7.0f} {fraction:8.0%} {speedup:7.2f}x")
    print(f"\nper token, {LAYERS} layers of these four GEMVs:")
    for kind, seconds in totals.items():
        print(f"  {kind:15s} {seconds * LAYERS * 1e3:6.3f} ms  ({totals['bf16'] / seconds:.2f}x bf16)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time a grid of GEMV tile shapes, keep the best")
    parser.add_argument(
        "--check", action="store_true", help="check every CUDA path against the reference first"
    )
    parser.add_argument("--rows", type=int, default=1, choices=range(1, 5), help="activation rows (1 to 4)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.check:
        failures = check(LLAMA3_8B_SHAPES[:2] + [("small", 40, 640)])
        print("CHECK", "FAILED: " + "; ".join(failures) if failures else "passed")
    bench(args.sweep, copy_bandwidth(torch.device("cuda")), args.rows)


if __name__ == "__main__":
    main()
