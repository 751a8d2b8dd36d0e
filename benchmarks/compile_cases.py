"""The kernel launches hopper_compile.py compiles: `test`, small launches of every kernel in every
dtype; `llama`, the launches of a Llama-3-8B decode (and a prefill chunk) on an H100/H200."""

from __future__ import annotations

import torch
from compile_shapes import HEAD_DIM, KV_HEADS, LLAMA3_8B_LAYERS, SMS, decode_batch
from pagoda_runtime.executor.kernels import (
    reference,
    triton_paged_attention,
    triton_rmsnorm,
    triton_rotary_kv_write,
    triton_silu_mul,
)
from pagoda_runtime.executor.quantization import dispatch, triton_mma
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8


def _quantized_weights(n: int, k: int, group: int) -> dict:
    w = torch.randn(n, k) * 0.02
    return {
        "int8": triton_mma.to_mma_layout(quantize_int8(w)),
        "fp8": triton_mma.to_mma_layout(quantize_fp8(w)),
        "int4": triton_mma.to_mma_layout(quantize_int4(w, group)),
    }


def _matmul_cases(shapes, rows_list, dtypes) -> list:
    """Every Triton path the dispatch table routes these shapes and batches to."""
    found = []
    for layer, n, k in shapes:
        weights = _quantized_weights(n, k, 128 if k % 128 == 0 else 32)
        for dtype in dtypes:
            weights["dense"] = triton_mma.dense_mma_weight(torch.randn(n, k, dtype=dtype))
            for (kind, weight), rows in ((item, r) for item in weights.items() for r in rows_list):
                plan = dispatch.route(kind, rows, n, k)
                x = torch.randn(rows, k, dtype=dtype)
                if plan.path == "mma":
                    call = lambda x=x, w=weight, c=plan.config: triton_mma.mma_matmul(x, w, c)  # noqa: E731
                elif kind != "dense":
                    call = lambda w=weight, d=dtype: triton_mma.dequantize_mma(w, d)  # noqa: E731
                else:
                    continue
                label = f"{kind} {layer} rows {rows}" + (f" {dtype}" if len(dtypes) > 1 else "")
                found.append((label, call))
    return found


def _attention_cases(batches) -> list:
    found = []
    for label, (batch, context, query_len, dtype, kv_dtype, splits) in batches.items():
        q, cache, meta = decode_batch(batch, context, dtype, kv_dtype, query_len)
        found.append(
            (
                label,
                lambda q=q, c=cache, m=meta, s=splits: triton_paged_attention.paged_attention(
                    q, c, m, HEAD_DIM**-0.5, num_splits=s
                ),
            )
        )
    return found


KERNELS = [
    (triton_paged_attention, "_paged_attention_kernel"),
    (triton_rotary_kv_write, "_rotary_kv_write_kernel"),
    (triton_rmsnorm, "_rms_norm_kernel"),
    (triton_silu_mul, "_silu_and_mul_kernel"),
    (triton_mma, "_mma_kernel"),
    (triton_mma, "_dequantize_kernel"),
]


def _small_cases() -> list:
    found = []
    for dtype in (torch.float32, torch.bfloat16):
        for kv_dtype in (None, reference.FP8_KV_DTYPE):
            found += _attention_cases(
                {
                    f"decode {dtype} cache {kv_dtype}": (3, 40, 1, dtype, kv_dtype, None),
                    f"decode, 4 splits, {dtype} cache {kv_dtype}": (3, 40, 1, dtype, kv_dtype, 4),
                    f"prefill {dtype} cache {kv_dtype}": (2, 70, 30, dtype, kv_dtype, None),
                }
            )
            q, cache, meta = decode_batch(2, 20, dtype, kv_dtype)
            k = torch.randn(2, KV_HEADS, HEAD_DIM, dtype=dtype)
            cos_sin = torch.randn(64, HEAD_DIM)
            found.append(
                (
                    f"rotary_write_kv {dtype} into {kv_dtype}",
                    lambda q=q, c=cache, m=meta, k=k, cs=cos_sin: triton_rotary_kv_write.rotary_write_kv(
                        torch.arange(2), q, k, k.clone(), cs, c, m.slot_mapping
                    ),
                )
            )
    x = torch.randn(5, 576, dtype=torch.bfloat16)
    found.append(("rms_norm", lambda: triton_rmsnorm.rms_norm(x, x[0], 1e-5, x)))
    found.append(("silu_and_mul", lambda: triton_silu_mul.silu_and_mul(x)))
    found += _matmul_cases([("small", 96, 256)], (1, 3, 17, 40, 100), (torch.bfloat16, torch.float16))
    found += _matmul_cases([("small", 40, 64)], (3,), (torch.float32,))
    return found


def _llama_cases() -> list:
    gpu = torch.device("cuda")
    found = _attention_cases(
        {
            f"decode batch {batch} context 4096" + (", fp8 cache" if kv else ""): (
                batch,
                4096,
                1,
                torch.bfloat16,
                kv,
                triton_paged_attention.max_splits(batch, KV_HEADS, gpu),
            )
            for batch in (1, 64)
            for kv in (None, reference.FP8_KV_DTYPE)
        }
        | {"prefill 2048 tokens": (1, 2048, 2048, torch.bfloat16, None, None)}
    )
    # The kernel's code depends on K, the tiles and the kind, so qkv stands for every K = 4096 layer
    # at 16 and 64 rows; at 1 and 4 rows every layer, to set beside the GEMVs tuned per layer before.
    found += _matmul_cases(LLAMA3_8B_LAYERS, (1, 4), (torch.bfloat16,))
    return found + _matmul_cases(LLAMA3_8B_LAYERS[:1], (16, 64), (torch.bfloat16,))


def cases(which: str) -> list:
    # What the GPU of the figures has; a CPU tensor cannot tell.
    triton_paged_attention._multiprocessor_count = lambda index: SMS
    return _small_cases() if which == "test" else _llama_cases()
