"""The fused mixture-of-experts layer (kernels/triton_moe.py) on the Qwen3-30B-A3B, Mixtral-8x7B and
GPT-OSS-20B layer shapes (the last with its expert biases and clamped SwiGLU), batch 1, 16 and 256,
bf16 experts and (--kinds) int8, fp8 and int4 ones.

Each time is the median of a CUDA graph that runs the layer (routing included) on several random
router logits, so every call routes to other experts and the 50 MB L2 cannot hold them. Each row
reports the time, the distinct experts the batch touched, the bytes those experts' weights take
over the time (GB/s, and the fraction of the device's measured copy bandwidth), the matmul
TFLOP/s, and the roofline bound: the larger of those bytes over the copy bandwidth and the FLOPs
over the measured bf16 matmul peak. --reference adds the same layer through the PyTorch
reference's expert loop (transformers' loop; eager, no graph); --smoke runs tiny shapes (on the
CPU through Triton's interpreter where there is no GPU: a check of this script, not a timing).

    .venv/bin/python -m benchmarks.moe_kernels [--check] [--sweep] [--reference]
        [--kinds bf16,int8,fp8,int4] [--batches 1,16,256] [--smoke] [--result-json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import asdict, dataclass

import torch

from benchmarks.kernel_timing import (
    bench_device,
    bench_dtype,
    device_name,
    eager_seconds,
    graph_seconds,
    relative_error,
)
from pagoda_runtime.bench.results import emit
from pagoda_runtime.bench.roofline import copy_bandwidth, matmul_peak
from pagoda_runtime.executor.kernels.moe_activation import ClampedSwiGLU
from pagoda_runtime.executor.kernels.moe_options import PLAIN, ExpertOptions
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_routing import route
from pagoda_runtime.executor.kernels.moe_weights import ExpertWeights, PackedExperts, quantize_experts
from pagoda_runtime.executor.kernels.triton_moe import MoeConfig, default_moe_config, fused_moe


@dataclass(frozen=True)
class MoeShape:
    name: str
    hidden: int
    intermediate: int  # per expert
    experts: int
    top_k: int
    renormalize: bool
    # GPT-OSS's experts: biases on gate_up and down, and the clamped SwiGLU.
    gpt_oss: bool = False


SHAPES = [
    MoeShape("qwen3-30b-a3b", 2048, 768, 128, 8, True),
    MoeShape("mixtral-8x7b", 4096, 14336, 8, 2, True),
    MoeShape("gpt-oss-20b", 2880, 2880, 32, 4, True, gpt_oss=True),
]
SMOKE_SHAPES = [
    MoeShape("tiny", 64, 32, 8, 2, True),
    MoeShape("tiny-gpt-oss", 64, 32, 8, 2, True, gpt_oss=True),
]
ROUTINGS = 8  # router logits per graph: each call touches other experts


@dataclass(frozen=True)
class Setup:
    device: torch.device
    dtype: torch.dtype
    bandwidth: float
    peak: float
    routings: int
    check: bool
    sweep: bool
    reference: bool


def expert_weights(shape: MoeShape, kind: str, setup: Setup) -> tuple[ExpertWeights, ExpertWeights]:
    gate_up = torch.randn(shape.experts, 2 * shape.intermediate, shape.hidden, device=setup.device) * 0.02
    down = torch.randn(shape.experts, shape.hidden, shape.intermediate, device=setup.device) * 0.02
    if kind == "bf16":
        return gate_up.to(setup.dtype), down.to(setup.dtype)
    return quantize_experts(gate_up, kind), quantize_experts(down, kind)


def expert_bytes(weights: ExpertWeights) -> float:
    if isinstance(weights, PackedExperts):
        return weights.weight.nbytes / weights.num_experts
    return weights[0].numel() * weights.element_size()


def sweep_configs() -> list[MoeConfig]:
    configs = [
        MoeConfig(bm, bn, bk, group_m=8, num_warps=4, num_stages=stages)
        for bm, bn, bk, stages in itertools.product((16, 32, 64), (32, 64, 128), (64, 128), (3, 4))
    ]
    return configs + [MoeConfig(128, bn, 64, group_m=8, num_warps=8, num_stages=3) for bn in (64, 128)]


def bench_batch(shape: MoeShape, kind: str, gate_up, down, batch: int, setup: Setup) -> dict:
    hidden = torch.randn(batch, shape.hidden, device=setup.device, dtype=setup.dtype)
    logits = [torch.randn(batch, shape.experts, device=setup.device) for _ in range(setup.routings)]
    options = floats = PLAIN
    if shape.gpt_oss:
        biases = [(shape.experts, 2 * shape.intermediate), (shape.experts, shape.hidden)]
        gate_up_bias, down_bias = (torch.randn(b, device=setup.device, dtype=setup.dtype) for b in biases)
        options = ExpertOptions(gate_up_bias, down_bias, ClampedSwiGLU())
        floats = ExpertOptions(gate_up_bias.float(), down_bias.float(), ClampedSwiGLU())

    def layer(router_logits, config=None):
        return fused_moe(
            hidden, router_logits, gate_up, down, shape.top_k, shape.renormalize, config, options
        )

    def reference():
        return reference_fused_moe(
            hidden.float(), logits[0], gate_up, down, shape.top_k, shape.renormalize, floats
        )

    if setup.check:
        err = relative_error(layer(logits[0]), reference())
        print(f"check {shape.name} {kind} batch {batch}: rel err {err:.2e}")
        if err > 2e-2:
            raise SystemExit(f"CHECK FAILED: {shape.name} {kind} batch {batch}: {err:.2e}")
    touched = sum(len(torch.unique(route(lg, shape.top_k, shape.renormalize)[1])) for lg in logits) / len(
        logits
    )
    moved = touched * (expert_bytes(gate_up) + expert_bytes(down)) + 2 * hidden.nbytes
    flops = 2 * batch * shape.top_k * 3 * shape.hidden * shape.intermediate
    default = default_moe_config(batch * shape.top_k, shape.experts, setup.dtype, gate_up)
    timed = []
    for config in sweep_configs() if setup.sweep else [default]:
        calls = [lambda lg=lg, c=config: layer(lg, c) for lg in logits]
        try:
            timed.append((graph_seconds(calls, setup.device), config))
        except Exception as error:  # a tile shape can exceed the shared memory
            print(f"  {shape.name} {kind} batch {batch} {config}: {type(error).__name__}")
    seconds, best = min(timed, key=lambda item: item[0])
    bound = max(moved / setup.bandwidth, flops / setup.peak)
    row = {
        "model": shape.name,
        "experts": kind,
        "batch": batch,
        "us": seconds * 1e6,
        "default_config_us": next((s for s, c in timed if c == default), math.nan) * 1e6,
        "config": asdict(best),
        "distinct_experts": touched,
        "weight_bytes": moved,
        "GBps": moved / seconds / 1e9,
        "fraction_of_copy_bandwidth": moved / seconds / setup.bandwidth,
        "TFLOPs": flops / seconds / 1e12,
        "roofline_us": bound * 1e6,
        "fraction_of_roofline": bound / seconds,
    }
    if setup.reference:
        row["reference_loop_us"] = eager_seconds(reference, setup.device) * 1e6
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the reference before timing")
    parser.add_argument("--sweep", action="store_true", help="time a grid of tile shapes, report the best")
    parser.add_argument("--reference", action="store_true", help="also time the PyTorch expert loop")
    parser.add_argument("--kinds", default="bf16", help="comma-separated: bf16, int8, fp8, int4")
    parser.add_argument("--batches", default="1,16,256")
    parser.add_argument("--models", default=",".join(s.name for s in SHAPES))
    parser.add_argument("--smoke", action="store_true", help="a tiny layer, to check this script")
    parser.add_argument("--result-json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = bench_device()
    setup = Setup(
        device=device,
        dtype=bench_dtype(device),
        bandwidth=copy_bandwidth(device),
        peak=matmul_peak(device, bench_dtype(device)),
        routings=1 if args.smoke else ROUTINGS,
        check=args.check,
        sweep=args.sweep,
        reference=args.reference,
    )
    shapes = SMOKE_SHAPES if args.smoke else [s for s in SHAPES if s.name in args.models.split(",")]
    rows = []
    for shape in shapes:
        for kind in args.kinds.split(","):
            gate_up, down = expert_weights(shape, kind, setup)
            rows += [bench_batch(shape, kind, gate_up, down, int(b), setup) for b in args.batches.split(",")]
            del gate_up, down
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(
        f"\ndevice: {device_name(device)}, copy {setup.bandwidth / 1e9:.0f} GB/s, "
        f"bf16 {setup.peak / 1e12:.0f} TFLOP/s"
    )
    print(
        f"{'model':14s} {'experts':7s} {'batch':>5s} {'us':>8s} {'bound':>8s} {'of bound':>8s} "
        f"{'GB/s':>6s} {'TFLOP/s':>7s}"
    )
    for r in rows:
        print(
            f"{r['model']:14s} {r['experts']:7s} {r['batch']:5d} {r['us']:8.1f} {r['roofline_us']:8.1f} "
            f"{r['fraction_of_roofline']:8.0%} {r['GBps']:6.0f} {r['TFLOPs']:7.1f}"
            + (f"  reference loop {r['reference_loop_us']:.0f} us" if "reference_loop_us" in r else "")
        )
    result = {
        "device": device_name(device),
        "copy_bandwidth_GBps": setup.bandwidth / 1e9,
        "matmul_peak_TFLOPs": setup.peak / 1e12,
        "rows": rows,
    }
    emit(result, args.result_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
