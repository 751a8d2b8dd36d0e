"""The projections of a Llama-3-8B layer at 1 to 64 activation rows, every path beside bf16:
bf16 through cuBLAS and through the tensor-core kernel (one kernel, no split-K), int8 / fp8 / int4
through the tensor-core kernel (quantization/triton_mma.py) and through cuBLAS on the widened
weight, fp8 through torch._scaled_mm, int4 through torch's tinygemm (torch._weight_int4pack_mm).

Reports microseconds per matmul, the bytes it must read (weight, activations, output) over that
time, the fraction of the device's copy bandwidth, the speed-up over the faster bf16 path, and per
kind the per-token time of 32 layers on the path the routing table (quantization/dispatch_table.
json) takes and on the fastest measured. Weights are random; on a GPU several copies of each are
cycled inside one CUDA graph so that the L2 cache cannot hold them.

    python -m benchmarks.quant_kernels [--check] [--sweep] [--rows 1,2,4,...]
        [--result-json PATH] [--write-table PATH] [--smoke]

--check compares every path with the dequantized reference first (a path that fails is not timed);
--sweep also times a grid of the tensor-core kernel's tiles; --write-table (which checks too)
writes the routing table from the timings (the fastest path per kind, rows and layer shape, the
int4 layout per shape); --smoke runs
tiny shapes on whatever device there is (the kernels in Triton's interpreter on a CPU) to check
the command line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from pagoda_runtime.bench.roofline import copy_bandwidth
from pagoda_runtime.executor.quantization import dispatch
from pagoda_runtime.executor.quantization.gpu_packed import TinygemmInt4Weight, tinygemm_supported
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8
from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize
from pagoda_runtime.executor.quantization.scaled_mm import fp8_scaled_mm
from pagoda_runtime.executor.quantization.triton_mma import (
    MmaConfig,
    block_m_for,
    dense_mma_weight,
    dequantize_mma,
    mma_matmul,
    to_mma_layout,
)

# (name, out_features, in_features) of one Llama-3-8B decoder layer with fused qkv and gate_up.
LLAMA3_8B_LAYERS = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
SMOKE_LAYERS = [("small", 48, 256)]
LAYERS = 32
ROWS = (1, 2, 4, 8, 16, 32, 64)
SMOKE_ROWS = (1, 3)
QUANTIZERS = {"int8": quantize_int8, "fp8": quantize_fp8, "int4": lambda w: quantize_int4(w, 128)}
STREAM_BYTES = 128 * 2**20  # cycle enough weight copies to stream this much per graph replay


def seconds_per_call(fn: Callable[[int], object], copies: int, device: torch.device) -> float:
    """Median seconds of fn(i), from a CUDA graph that runs it on each weight copy once; on a CPU
    (the kernels in Triton's interpreter, for --smoke) the time of one call."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn(0)
        return time.perf_counter() - start
    import triton.testing

    def run_all():
        for i in range(copies):
            fn(i)

    return triton.testing.do_bench_cudagraph(run_all, rep=20, return_mode="median") / 1e3 / copies


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def mma_config(kind: str, rows: int, n: int, k: int) -> MmaConfig:
    """The routing table's tiles for these rows where it routes them to the kernel, else the tiles
    of its first kernel entry that covers them."""
    plan = dispatch.route(kind, rows, n, k)
    if plan.path == "mma":
        return plan.config
    for entry in dispatch.load_table()["routes"][kind]:
        if entry["path"] == "mma" and rows <= entry.get("max_rows", rows):
            return MmaConfig(**entry["config"])
    return MmaConfig(block_m=block_m_for(rows))


def sweep_configs(kind: str, rows: int) -> list[MmaConfig]:
    block_m = block_m_for(rows)
    chunks = (128,) if kind == "int4" else (64, 128)
    grid = itertools.product((16, 32, 64), (1, 2, 4), (2, 3, 4), chunks)
    return [
        MmaConfig(block_n=bn, block_m=block_m, chunk=chunk, num_warps=warps, num_stages=stages)
        for bn, warps, stages, chunk in grid
        if bn >= 16 * warps
    ]


class Layer:
    """One layer shape's weights, in every layout a path reads, with `copies` of each."""

    def __init__(self, n: int, k: int, device: torch.device, tinygemm: bool) -> None:
        self.n, self.k, self.device = n, k, device
        dense = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        copies = max(1, math.ceil(STREAM_BYTES / dense.nbytes)) if device.type == "cuda" else 1
        self.dense = [dense] + [torch.randn_like(dense) * 0.02 for _ in range(copies - 1)]
        self.packed: dict[str, list[PackedWeight]] = {}
        for kind, quantize in QUANTIZERS.items():
            first = quantize(dense)
            count = max(1, math.ceil(STREAM_BYTES / first.nbytes)) if device.type == "cuda" else 1
            self.packed[kind] = [first] + [quantize(torch.randn_like(dense) * 0.02) for _ in range(count - 1)]
        self.mma = {kind: [to_mma_layout(w) for w in pool] for kind, pool in self.packed.items()}
        self.mma["dense"] = [dense_mma_weight(w) for w in self.dense]
        self.tinygemm = (
            [TinygemmInt4Weight(w) for w in self.packed["int4"]]
            if tinygemm and tinygemm_supported(self.packed["int4"][0])
            else []
        )

    def bytes_read(self, kind: str, rows: int) -> int:
        weight = self.dense[0].nbytes if kind == "dense" else self.packed[kind][0].nbytes
        return weight + rows * self.k * 2 + rows * self.n * 2

    def paths(self, kind: str, rows: int, configs: list[MmaConfig]) -> dict[str, tuple[Callable, int]]:
        """name -> (fn(x, copy index), copies) for every path of this kind."""
        found: dict[str, tuple[Callable, int]] = {}
        mma = self.mma[kind]
        for config in configs:
            found[f"mma {_config_label(config)}"] = (
                lambda x, i, c=config: mma_matmul(x, mma[i % len(mma)], c),
                len(mma),
            )
        if kind == "dense":
            found["cublas"] = (lambda x, i: F.linear(x, self.dense[i % len(self.dense)]), len(self.dense))
            return found
        found["dequantize_cublas"] = (
            lambda x, i: F.linear(x, dequantize_mma(mma[i % len(mma)], x.dtype)),
            len(mma),
        )
        pool = self.packed[kind]
        if kind == "fp8" and self.device.type == "cuda":
            found["scaled_mm"] = (lambda x, i: fp8_scaled_mm(x, pool[i % len(pool)]), len(pool))
        if kind == "int4" and self.tinygemm:
            found["tinygemm"] = (lambda x, i: self.tinygemm[i % len(self.tinygemm)](x), len(self.tinygemm))
        return found


def _config_label(config: MmaConfig) -> str:
    return (
        f"n{config.block_n} m{config.block_m} k{config.chunk}x{config.tiles} "
        f"w{config.num_warps} s{config.num_stages}"
    )


def check(layer: Layer, kind: str, rows: int, paths: dict) -> dict[str, str]:
    """Every path against the dequantized reference, on fresh random activations: path -> what
    was wrong, for each that failed."""
    failures = {}
    x = torch.randn(rows, layer.k, device=layer.device, dtype=torch.bfloat16)
    weight = layer.dense[0].float() if kind == "dense" else dequantize(layer.packed[kind][0])
    ref = x.float() @ weight.t()
    for name, (fn, _) in paths.items():
        try:
            out = fn(x, 0)
        except Exception as error:  # report every failing path, not just the first
            failures[name] = f"{kind} {layer.n}x{layer.k} rows={rows} {name}: {type(error).__name__}: {error}"
            continue
        err = relative_error(out, ref)
        # bf16 output: ~2e-3; fp8 activations (scaled_mm) and bf16 scales (tinygemm): more.
        bound = 5e-2 if name in ("scaled_mm", "tinygemm") else 1e-2
        print(f"check {kind:5s} {layer.n}x{layer.k} rows={rows:<3d} {name:32s} rel err {err:.2e}")
        if err > bound:
            failures[name] = f"{kind} {layer.n}x{layer.k} rows={rows} {name}: {err:.2e}"
    return failures


def measure(layers, rows_list, sweep: bool, run_check: bool, device: torch.device, bandwidth: float) -> dict:
    results, failures = [], []
    for name, n, k in layers:
        layer = Layer(n, k, device, tinygemm=device.type == "cuda")
        for kind, rows in itertools.product(("dense", *QUANTIZERS), rows_list):
            configs = sweep_configs(kind, rows) if sweep else [mma_config(kind, rows, n, k)]
            paths = layer.paths(kind, rows, configs)
            failed: dict[str, str] = {}
            if run_check:  # the first tiles and every other path
                checked = {
                    p: v for i, (p, v) in enumerate(paths.items()) if i == 0 or not p.startswith("mma")
                }
                failed = check(layer, kind, rows, checked)
                failures += failed.values()
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            moved = layer.bytes_read(kind, rows)
            for path, (fn, copies) in paths.items():
                if path in failed:  # a wrong path is never timed, so never routed to
                    continue
                try:
                    seconds = seconds_per_call(lambda i, fn=fn, x=x: fn(x, i), copies, device)
                except Exception as error:  # a tile can exceed registers or shared memory
                    print(f"  {name} {kind} rows={rows} {path} failed: {type(error).__name__}")
                    continue
                results.append(
                    {
                        "layer": name,
                        "n": n,
                        "k": k,
                        "kind": kind,
                        "rows": rows,
                        "path": path.split(" ")[0],
                        "config": asdict(configs[list(paths).index(path)])
                        if path.startswith("mma")
                        else None,
                        "seconds": seconds,
                        "GBps": moved / seconds / 1e9,
                        "fraction_of_copy": moved / seconds / bandwidth,
                    }
                )
        del layer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"results": results, "failures": failures}


def best(results: list[dict], **match) -> dict | None:
    rows = [r for r in results if all(r[key] == value for key, value in match.items())]
    return min(rows, key=lambda r: r["seconds"]) if rows else None


def routed(results: list[dict], kind: str, rows: int, n: int, k: int) -> dict | None:
    """The measurement of the path (and tiles) the routing table takes."""
    plan = dispatch.route(kind, rows, n, k)
    if kind == "int4" and dispatch.int4_layout(n, k) == "tinygemm":
        return best(results, kind=kind, rows=rows, n=n, k=k, path="tinygemm")
    if plan.path == "mma":
        return best(results, kind=kind, rows=rows, n=n, k=k, path="mma", config=asdict(plan.config))
    return best(results, kind=kind, rows=rows, n=n, k=k, path=plan.path)


def summarize(results: list[dict], layers, rows_list) -> list[dict]:
    """Per kind and rows: the time of LAYERS layers of these projections, routed and fastest,
    against the faster bf16 path."""
    summary = []
    for kind, rows in itertools.product(("dense", *QUANTIZERS), rows_list):
        picked = [routed(results, kind, rows, n, k) for _, n, k in layers]
        fastest = [best(results, kind=kind, rows=rows, n=n, k=k) for _, n, k in layers]
        bf16 = [best(results, kind="dense", rows=rows, n=n, k=k) for _, n, k in layers]
        if None in picked + fastest + bf16:
            continue
        routed_s = LAYERS * sum(r["seconds"] for r in picked)
        fastest_s = LAYERS * sum(r["seconds"] for r in fastest)
        bf16_s = LAYERS * sum(r["seconds"] for r in bf16)
        summary.append(
            {
                "kind": kind,
                "rows": rows,
                "routed_ms_per_token": routed_s * 1e3,
                "fastest_ms_per_token": fastest_s * 1e3,
                "routed_vs_bf16": bf16_s / routed_s,
                "fastest_vs_bf16": bf16_s / fastest_s,
            }
        )
    return summary


def _tinygemm_faster(results: list[dict], n: int, k: int, decode_rows: list[int]) -> bool:
    """Whether torch's int4 kernel took less time than ours over the decode batch sizes."""
    tiny = [best(results, kind="int4", rows=r, n=n, k=k, path="tinygemm") for r in decode_rows]
    ours = [best(results, kind="int4", rows=r, n=n, k=k, path="mma") for r in decode_rows]
    if not decode_rows or None in tiny + ours:
        return False
    return sum(t["seconds"] for t in tiny) < sum(o["seconds"] for o in ours)


def routing_table(results: list[dict], layers, rows_list, previous: dict, source: str) -> dict:
    """The routing table with an entry per kind, rows and measured shape for its fastest path,
    ahead of the previous table's entries (which keep serving other shapes)."""
    routes: dict[str, list[dict]] = {}
    layouts = {"default": previous.get("int4_layout", {}).get("default", "mma")}
    for _, n, k in layers:
        if _tinygemm_faster(results, n, k, [r for r in rows_list if r <= 16]):
            layouts[f"{n}x{k}"] = "tinygemm"
    for kind in ("dense", *QUANTIZERS):
        entries = []
        for _, n, k in layers:
            for rows in sorted(rows_list):
                fastest = best(results, kind=kind, rows=rows, n=n, k=k)
                if fastest is None or fastest["path"] == "tinygemm":
                    continue
                entry = {"max_rows": rows, "shape": [n, k], "path": fastest["path"]}
                if fastest["config"]:
                    entry["config"] = fastest["config"]
                entries.append(entry)
        routes[kind] = entries + previous["routes"][kind]
    return {"source": source, "rows": sorted(rows_list), "int4_layout": layouts, "routes": routes}


def print_table(results: list[dict], summary: list[dict], bandwidth: float, device_name: str) -> None:
    print(f"\ndevice: {device_name}, copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    header = ("layer", "kind", "rows", "path", "us", "GB/s", "of copy", "vs bf16")
    print("{:8s} {:6s} {:>4s} {:18s} {:>9s} {:>7s} {:>8s} {:>8s}".format(*header))
    for r in results:
        bf16 = best(results, kind="dense", rows=r["rows"], n=r["n"], k=r["k"])
        print(
            f"{r['layer']:8s} {r['kind']:6s} {r['rows']:>4d} {r['path']:18s} {r['seconds'] * 1e6:9.2f} "
            f"{r['GBps']:7.0f} {r['fraction_of_copy']:8.0%} {bf16['seconds'] / r['seconds']:7.2f}x"
        )
    print(f"\nper token, {LAYERS} layers of these projections (routed / fastest path):")
    for s in summary:
        routed_part = f"{s['routed_ms_per_token']:8.3f} ms ({s['routed_vs_bf16']:.2f}x bf16)"
        fastest_part = f"{s['fastest_ms_per_token']:8.3f} ms ({s['fastest_vs_bf16']:.2f}x)"
        print(f"  {s['kind']:6s} rows {s['rows']:>3d}  {routed_part}  fastest {fastest_part}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare every path with the reference first")
    parser.add_argument("--sweep", action="store_true", help="time a grid of the kernel's tiles")
    parser.add_argument("--rows", help="comma-separated activation rows (default 1,2,4,8,16,32,64)")
    parser.add_argument("--result-json", help="write the timings and the per-token summary here")
    parser.add_argument("--write-table", type=Path, help="write the routing table from the timings here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    args = parser.parse_args(argv)
    # The table routes to the fastest path that computed the right result.
    run_check = args.check or args.write_table is not None
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    layers = SMOKE_LAYERS if args.smoke else LLAMA3_8B_LAYERS
    rows_list = (
        tuple(int(r) for r in args.rows.split(",")) if args.rows else SMOKE_ROWS if args.smoke else ROWS
    )
    bandwidth = copy_bandwidth(device)
    measured = measure(layers, rows_list, args.sweep, run_check, device, bandwidth)
    summary = summarize(measured["results"], layers, rows_list)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print_table(measured["results"], summary, bandwidth, device_name)
    if measured["failures"]:
        print("CHECK FAILED: " + "; ".join(measured["failures"]))
    elif run_check:
        print("CHECK passed")
    result = {
        "shape": "tiny" if args.smoke else "llama-3-8b",
        "device": device_name,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "rows": list(rows_list),
        "routing_table": dispatch.load_table()["source"],
        "summary": summary,
        "results": measured["results"],
        "failures": measured["failures"],
    }
    if args.result_json:
        Path(args.result_json).write_text(json.dumps(result, indent=1) + "\n")
    if args.write_table:
        source = f"bench.quant_kernels on {device_name}, {time.strftime('%Y-%m-%d')}"
        table = routing_table(measured["results"], layers, rows_list, dispatch.load_table(), source)
        args.write_table.write_text(json.dumps(table, indent=1) + "\n")
    return 1 if measured["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
