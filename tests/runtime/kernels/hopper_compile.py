"""Compiles every Triton kernel launch the runtime makes, for a Hopper GPU (sm_90), on a machine
without one: what Triton's interpreter never checks (tl.dot's minimum sizes, types only the
compiler sees) fails here as it would on the GPU.

Run as its own process (test_triton_compiles_for_hopper.py does): torch.cuda.is_available is made
to answer True before pagoda_runtime is imported, so pagoda_runtime.executor.triton_mode leaves the kernels
compiled; the public wrappers are then called on CPU tensors with each kernel replaced by a recorder,
so nothing is launched, and each recorded launch is compiled through ptxas to a cubin. Prints one
JSON object: {"kernels": [every kernel], "compiled": [launches], "failed": {launch: error}}.
"""

from __future__ import annotations

import json
import os
import sys

import torch

# Before triton is imported and pagoda_runtime decides how it runs: compiled kernels.
os.environ["TRITON_INTERPRET"] = "0"
torch.cuda.is_available = lambda: True

import triton  # noqa: E402
from pagoda_runtime.executor.kernels import (  # noqa: E402
    reference,
    triton_paged_attention,
    triton_rmsnorm,
    triton_rotary_kv_write,
    triton_sampling,
    triton_silu_mul,
)
from pagoda_runtime.executor.quantization import triton_gemm, triton_gemv  # noqa: E402
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tests.runtime.kernels.paged_batch import make_paged_batch  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
TRITON_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float8_e4m3fn: "fp8e4nv",
}
KERNELS = [
    (triton_paged_attention, "_paged_attention_kernel"),
    (triton_paged_attention, "_merge_splits_kernel"),
    (triton_rotary_kv_write, "_rotary_kv_write_kernel"),
    (triton_rmsnorm, "_rms_norm_kernel"),
    (triton_silu_mul, "_silu_and_mul_kernel"),
    (triton_sampling, "_sample_kernel"),
    (triton_gemm, "_int4_gemm_kernel"),
    (triton_gemm, "_w8_gemm_kernel"),
    (triton_gemv, "_int4_gemv_kernel"),
    (triton_gemv, "_w8_gemv_kernel"),
]


class Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the launch instead."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches, self.label = kernel, launches, ""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.label, self.kernel, args, kwargs))


def _signature(kernel, args, kwargs):
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    values = dict(zip(kernel.arg_names, args, strict=False)) | kwargs
    signature, constexprs = {}, {}
    for param in kernel.params:
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if abs(value) < 2**31 else "i64"
        else:
            signature[param.name] = "fp32"
    return ASTSource(kernel, signature, constexprs), options


def _launches() -> list:
    launches: list = []
    recorders = {}
    for module, name in KERNELS:
        recorders[name] = Recorder(getattr(module, name), launches)
        setattr(module, name, recorders[name])

    def record(label, fn):
        for recorder in recorders.values():
            recorder.label = label
        fn()

    for dtype, head_dim, kv_dtype in [
        (torch.float32, 8, None),  # the tiny test models: head_dim 8
        (torch.bfloat16, 128, None),
        (torch.bfloat16, 64, reference.FP8_KV_DTYPE),
    ]:
        for seqs, splits in [([(40, 1), (17, 1)], 4), ([(40, 30), (9, 1)], None)]:
            batch = make_paged_batch(seqs, 8, 2, head_dim, 16, dtype=dtype, kv_cache_dtype=kv_dtype)
            label = f"attention {dtype} head_dim {head_dim} cache {kv_dtype} splits {splits}"
            record(
                label,
                lambda b=batch, s=splits: triton_paged_attention.paged_attention(
                    b.q, b.kv_cache, b.meta, 0.1, num_splits=s
                ),
            )
        cos_sin = torch.randn(64, head_dim)
        record(
            f"rotary_write_kv {dtype} into {kv_dtype}",
            lambda b=batch, c=cos_sin: triton_rotary_kv_write.rotary_write_kv(
                torch.arange(b.q.shape[0]) % 64, b.q, b.k_new, b.v_new, c, b.kv_cache, b.meta.slot_mapping
            ),
        )
    x = torch.randn(5, 576, dtype=torch.bfloat16)
    record("rms_norm", lambda: triton_rmsnorm.rms_norm(x, x[0], 1e-5, x))
    record("silu_and_mul", lambda: triton_silu_mul.silu_and_mul(x))
    for vocab in (128256, 49152):  # Llama 3's vocabulary and the bundled model's
        logits, rows = torch.empty(4, vocab), torch.arange(3)
        params = (torch.ones(3), torch.zeros(3, dtype=torch.int32), torch.ones(3), torch.zeros(3))
        seeds, out = torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
        record(
            f"sample vocab {vocab}", lambda a=(logits, rows, *params, seeds, out): triton_sampling.sample(*a)
        )
    w = torch.randn(96, 64)
    for name, weight in [
        ("int4", quantize_int4(w, 32)),
        ("int8", quantize_int8(w)),
        ("fp8", quantize_fp8(w)),
    ]:
        for dtype, rows in [(torch.float32, 3), (torch.bfloat16, 20)]:
            xs = torch.randn(rows, 64, dtype=dtype)
            matmul = triton_gemv.gemv if rows <= 4 else triton_gemm.gemm
            record(f"{matmul.__name__} {name} {dtype} rows {rows}", lambda m=matmul, a=xs, q=weight: m(a, q))
    return launches


def main() -> int:
    compiled, failed = [], {}
    for label, kernel, args, kwargs in _launches():
        name = f"{kernel.fn.__name__} ({label})"
        source, options = _signature(kernel, args, dict(kwargs))
        try:
            triton.compile(source, target=HOPPER, options=options)
            compiled.append(name)
        except Exception as error:  # report every launch that fails, not only the first
            failed[name] = f"{type(error).__name__}: {str(error)[-400:]}"
    kernels = [name for _, name in KERNELS]
    print(json.dumps({"kernels": kernels, "compiled": compiled, "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
