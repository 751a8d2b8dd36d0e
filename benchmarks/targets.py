"""The GPU performance targets, each checked against the JSON that scripts/gpu-bench.sh wrote.

A target names the result file and the figure in it, so that a run on the card says at once which
targets it met and which file to read for the rest. A file the run did not write is "not
measured", never a pass. The numbers are the project's targets for the Llama-3-8B shape on one
H100 (the 1B rows: the Llama-3.2-1B shape); a figure of another shape is shown but judged "not
comparable", and on another card the verdicts only say how far the figures are from those numbers.

    python -m benchmarks.targets DIR     # prints the table, writes DIR/targets.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# TensorRT-LLM's published output tok/s for Llama-3.1-8B in fp8, 1k in / 1k out, on one H100.
TENSORRT_LLM_FP8_1K = 15_220.0


@dataclass(frozen=True)
class Target:
    name: str
    pattern: str  # the result file, a glob in the results folder
    figure: Callable[[dict], float]
    bound: float
    at_least: bool = True  # False: the figure must stay at or below the bound
    stretch: bool = False  # reported against the bound, not a pass or a failure
    shape: str = "llama-3-8b"  # the bound holds for this shape only


def _results(key: str) -> Callable[[dict], float]:
    return lambda data: data["results"][key]


def _quant_speedup(quantization: str) -> Callable[[dict], float]:
    def figure(data: dict) -> float:
        (row,) = [r for r in data["rows"] if r["quantization"] == quantization]
        if "speedup" not in row:
            raise KeyError(f"{quantization} did not run: {row.get('error', 'no speedup recorded')}")
        return row["speedup"]

    return figure


def _slowest_quantized_vs_bf16(rows: int) -> Callable[[dict], float]:
    """bench.quant_kernels: the slowest of int8, fp8 and int4 at `rows` activation rows, per token
    of the routed paths, as a multiple of bf16's speed."""

    def figure(data: dict) -> float:
        found = [s["routed_vs_bf16"] for s in data["summary"] if s["rows"] == rows and s["kind"] != "dense"]
        if len(found) != 3:
            raise KeyError(f"quant_kernels has no timings at {rows} rows for every quantized kind")
        return min(found)

    return figure


def _decode_attention(batch: int, context: int) -> Callable[[dict], float]:
    def figure(data: dict) -> float:
        (row,) = [
            r for r in data["decode"] if (r["batch"], r["context"], r["cache"]) == (batch, context, "bf16")
        ]
        return row["fraction_of_copy"]

    return figure


def _priority_ttft(data: dict) -> float:
    """benchmarks.priority_ttft: interactive TTFT p95 under a saturating batch load as a multiple of
    the idle server's, under --scheduling-policy priority."""
    (row,) = [r for r in data["results"] if r["policy"] == "priority"]
    return row["loaded_over_idle_p95"]


def _gpu_idle_share(data: dict) -> float:
    """1 - kernel time / wall time over the same profiled steps (the first left out: it starts on an
    idle device); with async scheduling a step's kernels run into the next step's range, so the
    share is taken over the steps together, not per step."""
    return data["device_idle_share"]


TARGETS = (
    Target("batch-1 bf16 decode tok/s", "latency_b1.json", _results("decode_tok_per_s"), 170.0),
    Target(
        "batch-1 decode, fraction of roofline",
        "latency_b1.json",
        _results("decode_fraction_of_roofline_batch1"),
        0.85,
    ),
    Target(
        "offline 8B, fraction of roofline",
        "throughput_llama-3-8b.json",
        _results("fraction_of_roofline"),
        0.80,
    ),
    Target("offline 8B, x transformers", "throughput_llama-3-8b.json", _results("speedup_vs_hf"), 8.0),
    Target(
        "offline 1B, fraction of roofline",
        "throughput_llama-3.2-1b.json",
        _results("fraction_of_roofline"),
        0.80,
        shape="llama-3.2-1b",
    ),
    Target(
        "offline 1B, x transformers",
        "throughput_llama-3.2-1b.json",
        _results("speedup_vs_hf"),
        8.0,
        shape="llama-3.2-1b",
    ),
    Target("int8 batch-1 decode, x bf16", "quantization_speed.json", _quant_speedup("int8"), 1.6),
    Target("fp8 batch-1 decode, x bf16", "quantization_speed.json", _quant_speedup("fp8"), 1.6),
    Target("int4 batch-1 decode, x bf16", "quantization_speed.json", _quant_speedup("int4"), 2.5),
    Target(
        "quantized matmuls at 4 rows, slowest kind x bf16",
        "quant_kernels.json",
        _slowest_quantized_vs_bf16(4),
        1.0,
    ),
    Target(
        "quantized matmuls at 16 rows, slowest kind x bf16",
        "quant_kernels.json",
        _slowest_quantized_vs_bf16(16),
        1.3,
    ),
    Target(
        "paged decode attention, batch 64, 4k context, of copy bandwidth",
        "attention_kernels.json",
        _decode_attention(64, 4096),
        0.75,
    ),
    Target(
        "GPU idle share of a step at 256 sequences",
        "step_profile_*_b256.json",
        _gpu_idle_share,
        0.05,
        at_least=False,
    ),
    Target(
        "decode step, batch 32 with 4 LoRA adapters of rank 16, over the base",
        "lora_decode_step.json",
        lambda data: data["adapters_overhead"],
        0.15,
        at_least=False,
    ),
    Target(
        "interactive TTFT p95 under a batch load, x idle (priority policy)",
        "priority_ttft_*.json",
        _priority_ttft,
        2.0,
        at_least=False,
    ),
    Target(
        "fp8 + fp8 KV 1k/1k output tok/s (TensorRT-LLM 15,220)",
        "throughput_*_fp8_fp8kv.json",
        _results("output_tok_per_s"),
        TENSORRT_LLM_FP8_1K,
        stretch=True,
    ),
)


def check(target: Target, folder: Path) -> dict:
    """One target's row: the figure measured, the bound and the verdict, or why it has none."""
    row = {"target": target.name, "bound": target.bound, "at_least": target.at_least}
    files = sorted(folder.glob(target.pattern))
    if not files:
        return {**row, "verdict": "not measured", "why": f"no {target.pattern} in {folder}"}
    data = json.loads(files[0].read_text())
    try:
        value = target.figure(data)
    except (KeyError, ValueError, ZeroDivisionError) as error:
        return {
            **row,
            "file": files[0].name,
            "verdict": "not measured",
            "why": f"{type(error).__name__}: {error}",
        }
    row = {**row, "file": files[0].name, "measured": value}
    # The step profile names its shape `model`; the other results `shape`.
    shape = data.get("shape", data.get("model"))
    if shape != target.shape:
        return {**row, "verdict": f"not comparable ({shape}, not {target.shape})"}
    met = value >= target.bound if target.at_least else value <= target.bound
    verdict = f"{value / target.bound:.0%} of it" if target.stretch else "met" if met else "missed"
    return {**row, "verdict": verdict}


def check_all(folder: Path) -> list[dict]:
    return [check(target, folder) for target in TARGETS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the results folder of scripts/gpu-bench.sh")
    args = parser.parse_args(argv)
    rows = check_all(args.folder)
    (args.folder / "targets.json").write_text(json.dumps(rows, indent=2))
    for row in rows:
        sign = ">=" if row["at_least"] else "<="
        measured = f"{row['measured']:,.3g}" if "measured" in row else "-"
        print(f"{row['target']:55s} {measured:>10s} {sign} {row['bound']:<8,.3g} {row['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
