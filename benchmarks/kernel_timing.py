"""Timing and checking helpers shared by the kernel micro-benchmarks (moe_kernels, lora_kernels)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch


def bench_device() -> torch.device:
    """The GPU; the CPU where there is none, so a --smoke run checks a benchmark's code on tiny
    shapes through Triton's interpreter (its times mean nothing there)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bench_dtype(device: torch.device) -> torch.dtype:
    """bf16 on the GPU; float32 in Triton's interpreter, which cannot multiply bf16 (it keeps the raw
    bits, triton-lang/triton#11584)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"


def graph_seconds(calls: Sequence[Callable[[], object]], device: torch.device) -> float:
    """Median seconds per call of a CUDA graph that makes every call once (after a warm-up pass that
    compiles the kernels); on the CPU, one timed pass."""
    for call in calls:
        call()
    if device.type != "cuda":
        start = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - start) / len(calls)
    import triton.testing  # here, not at the top: a CPU run's kernels choose the interpreter first

    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median") / 1e3 / len(calls)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; infinite where out holds NaN or inf."""
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def eager_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Median seconds of fn called eagerly (code a CUDA graph cannot hold: host syncs); on the CPU,
    one timed call after a warm-up."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, return_mode="median") / 1e3
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
