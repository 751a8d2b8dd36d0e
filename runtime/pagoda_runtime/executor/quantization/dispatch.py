"""Which matmul serves a projection on CUDA, by weight kind, activation rows and layer shape.

The routes live in dispatch_table.json beside this file: for each kind, a list of entries tried in
order, each with the `max_rows`, `max_out_features`, `max_in_features` or exact `shape` [N, K] it
applies to (all optional), a `path` and, for the tensor-core kernel, its tile `config`.
`python -m benchmarks.quant_kernels --write-table` rewrites the file from timings on a
GPU; until one has run, it holds reasoned defaults (its "source" says which): the kernel up to 64
rows for the quantized kinds (its cost is nearly flat from 1 to 8 rows), cuBLAS on the widened
weight or fp8 `_scaled_mm` above, and for bf16 the kernel at batch 1 on the layers where cuBLAS
splits K (up to 8192 outputs and inputs; it streams the large ones at 89-98% of copy bandwidth).

Paths:
- mma: triton_mma.py, weights read in their stored width, one kernel, no split-K.
- cublas: torch's own matmul of the unquantized weight (dense layers only).
- dequantize_cublas: the weight widened to the activations' dtype in one pass, then cuBLAS; for
  prefill, where the matmul's arithmetic outweighs one extra pass over the weight.
- scaled_mm: fp8 x fp8 on the tensor cores (activations quantized per token), torch._scaled_mm.
- tinygemm: torch._weight_int4pack_mm, int4 only; a layout of its own, so it is chosen per layer
  shape at load (`int4_layout`) and then serves every batch size of that layer.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from pagoda_runtime.executor.quantization.triton_mma import MmaConfig

TABLE = Path(__file__).with_name("dispatch_table.json")
PATHS = ("mma", "cublas", "dequantize_cublas", "scaled_mm", "tinygemm")


@dataclass(frozen=True)
class Route:
    path: str
    config: MmaConfig | None = None


@functools.cache
def load_table(path: Path = TABLE) -> dict:
    table = json.loads(path.read_text())
    for kind, entries in table["routes"].items():
        for entry in entries:
            if entry["path"] not in PATHS:
                raise ValueError(
                    f"{path}: {kind} routes to unknown path {entry['path']!r}; use one of {PATHS}"
                )
    return table


def _applies(entry: dict, rows: int, n: int, k: int) -> bool:
    return (
        rows <= entry.get("max_rows", rows)
        and n <= entry.get("max_out_features", n)
        and k <= entry.get("max_in_features", k)
        and entry.get("shape", [n, k]) == [n, k]
    )


@functools.cache
def route(kind: str, rows: int, n: int, k: int) -> Route:
    """The path for x [rows, k] @ W^T with W [n, k] of `kind` (dense, int8, fp8, int4)."""
    for entry in load_table()["routes"][kind]:
        if _applies(entry, rows, n, k):
            config = entry.get("config")
            return Route(entry["path"], MmaConfig(**config) if config else None)
    raise LookupError(f"{TABLE.name} has no route for {kind} weights of {n}x{k} at {rows} rows")


def int4_layout(n: int, k: int) -> str:
    """'tinygemm' where the table measured torch._weight_int4pack_mm faster for this shape, else 'mma'."""
    layouts = load_table().get("int4_layout", {})
    return layouts.get(f"{n}x{k}", layouts.get("default", "mma"))
