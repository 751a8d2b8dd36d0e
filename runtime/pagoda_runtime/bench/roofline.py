"""What the hardware allows: the device's measured copy bandwidth and matmul peak, and the time a
step (or a run of steps) cannot beat on them.

A step moves its weights once (sizing.decode_read_bytes: the input embedding only for its rows),
reads the keys and values of every context token of every sequence in it and writes those of its
new tokens; it computes 2 FLOPs per linear parameter per token, the LM head for the sampled rows
only, and attention's QK and PV over the (query, key) pairs it scores. Its bound is the larger of
bytes / bandwidth and FLOPs / peak; a run's roofline is the sum over its steps. Activations,
norms and the embedding rows are left out: next to the weights and the KV cache they are noise.
A step that samples nothing (a middle chunk of a long prompt) still counts the LM head's bytes;
such a step is compute-bound, so they do not change its bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pagoda_runtime.engine.stats import StepShape

if TYPE_CHECKING:
    from pagoda_runtime.executor.model_runner import ModelRunner

# Large enough to leave the caches behind: 1 GiB on a GPU (50 MB of L2), 64 MiB on a CPU.
CUDA_COPY_BYTES = 2**30
CPU_COPY_BYTES = 64 * 2**20
# A square GEMM big enough for the tensor cores' peak on a GPU; one a CPU finishes in milliseconds.
CUDA_GEMM_SIZE = 8192
CPU_GEMM_SIZE = 512
WARMUP, REPS = 3, 10


@dataclass(frozen=True)
class Hardware:
    copy_bandwidth: float  # bytes per second, counting bytes read plus written
    matmul_peak: float  # FLOP per second of a large GEMM in the engine's dtype

    def as_results(self) -> dict[str, float]:
        return {
            "copy_bandwidth_GBps": self.copy_bandwidth / 1e9,
            "matmul_peak_TFLOPs": self.matmul_peak / 1e12,
        }


def _seconds_per_call(fn: Callable[[], object], device: torch.device) -> float:
    """CUDA: events around REPS queued calls (the mean, no host gaps); CPU: the fastest of REPS."""
    for _ in range(WARMUP):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(REPS):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3 / REPS
    best = float("inf")
    for _ in range(REPS):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read plus written."""
    size = CUDA_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    src = torch.empty(size, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    return 2 * size / _seconds_per_call(lambda: dst.copy_(src), device)


def matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP per second of a square GEMM in `dtype` (bf16 on a GPU: what cuBLAS gets from the card)."""
    n = CUDA_GEMM_SIZE if device.type == "cuda" else CPU_GEMM_SIZE
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _seconds_per_call(lambda: torch.mm(a, b, out=out), device)


def measure(device: torch.device, dtype: torch.dtype) -> Hardware:
    """Both figures, before the engine takes the device's memory for its KV cache (their buffers
    go back to the device when this returns)."""
    hardware = Hardware(copy_bandwidth(device), matmul_peak(device, dtype))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return hardware


@dataclass(frozen=True)
class ModelCosts:
    """What one model, as built, moves and computes per unit of a StepShape."""

    weight_bytes: int  # read once per step (ModelRunner.decode_weight_bytes)
    kv_bytes_per_token: int  # keys and values of one token, all layers, at the cache's dtype
    linear_flops_per_token: int  # 2 x the decoder blocks' linear parameters a token goes through
    lm_head_flops_per_row: int  # 2 x vocabulary x hidden
    attention_flops_per_pair: int  # QK and PV: 4 x query heads x head dim, all layers

    def step_bytes(self, shape: StepShape) -> int:
        kv_tokens = shape.context_tokens + shape.num_tokens  # read, and written for the new tokens
        return self.weight_bytes + kv_tokens * self.kv_bytes_per_token

    def step_flops(self, shape: StepShape) -> int:
        return (
            self.linear_flops_per_token * shape.num_tokens
            + self.lm_head_flops_per_row * shape.num_sampled
            + self.attention_flops_per_pair * shape.attended_pairs
        )


def model_costs(runner: ModelRunner) -> ModelCosts:
    arch = runner.config.architecture.per_rank(runner.tp.size)
    linear = arch.active_linear_parameters()
    return ModelCosts(
        weight_bytes=runner.decode_weight_bytes,
        kv_bytes_per_token=runner.kv_bytes_per_token,
        linear_flops_per_token=2 * linear,
        lm_head_flops_per_row=2 * arch.vocab_size * arch.hidden_size,
        attention_flops_per_pair=4 * arch.q_size * arch.num_hidden_layers,
    )


@dataclass(frozen=True)
class Roofline:
    seconds: float  # the sum over the steps of each one's bound
    bytes: int
    flops: int
    steps: int
    memory_bound_steps: int  # steps whose bound is the bandwidth's

    def as_results(self, measured_s: float) -> dict[str, float | int]:
        return {
            "roofline_s": self.seconds,
            "fraction_of_roofline": self.seconds / measured_s,
            "roofline_bytes": self.bytes,
            "roofline_flops": self.flops,
            "roofline_steps": self.steps,
            "roofline_memory_bound_steps": self.memory_bound_steps,
        }


def roofline(shapes: Iterable[StepShape], costs: ModelCosts, hardware: Hardware) -> Roofline:
    seconds = 0.0
    total_bytes = total_flops = steps = memory_bound = 0
    for shape in shapes:
        moved, computed = costs.step_bytes(shape), costs.step_flops(shape)
        memory_s, compute_s = moved / hardware.copy_bandwidth, computed / hardware.matmul_peak
        seconds += max(memory_s, compute_s)
        total_bytes += moved
        total_flops += computed
        steps += 1
        memory_bound += memory_s >= compute_s
    return Roofline(seconds, total_bytes, total_flops, steps, memory_bound)


def batch1_tok_per_s(costs: ModelCosts, hardware: Hardware) -> float:
    """Decode tokens per second at batch 1 if the weights streamed at the copy bandwidth (the KV
    cache of a short context is left out)."""
    return hardware.copy_bandwidth / costs.weight_bytes
