"""hopper_compile.py --before: the Llama-3-8B launches of the kernels as commit 00b838f had them
(the GEMVs of quantization/triton_gemv.py with their default tiles; paged attention with its
`while` loop over the keys and split-K by batch size alone). It imports that commit's API, so it
runs only on that commit's runtime (see hopper_compile.py's docstring); the committed baseline
benchmarks/results/sm90/compile_before.json came from it."""

from __future__ import annotations

import torch

from compile_shapes import HEAD_DIM, LLAMA3_8B_LAYERS, SMS, decode_batch
from pagoda_runtime.executor.kernels import triton_paged_attention
from pagoda_runtime.executor.quantization import triton_gemv
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8

KERNELS = [
    (triton_paged_attention, "_paged_attention_kernel"),
    (triton_paged_attention, "_merge_splits_kernel"),
    (triton_gemv, "_int4_gemv_kernel"),
    (triton_gemv, "_w8_gemv_kernel"),
]
QUANTIZERS = {"int8": quantize_int8, "fp8": quantize_fp8, "int4": lambda w: quantize_int4(w, 128)}


def cases(which: str):
    triton_paged_attention._multiprocessor_count = lambda index: SMS
    found = []
    # What default_num_splits chose on a 132-multiprocessor GPU (it answers 1 for CPU tensors).
    for batch, context, splits in ((1, 4096, 32), (64, 4096, 1)):
        q, cache, meta = decode_batch(batch, context)
        found.append(
            (
                f"decode batch {batch} context {context}",
                lambda q=q, c=cache, m=meta, s=splits: triton_paged_attention.paged_attention(
                    q, c, m, HEAD_DIM**-0.5, s
                ),
            )
        )
    for (layer, n, k), (kind, quantize) in zip(
        LLAMA3_8B_LAYERS * 3, [item for item in QUANTIZERS.items() for _ in LLAMA3_8B_LAYERS], strict=True
    ):
        weight = quantize(torch.randn(n, k) * 0.02)
        for rows in (1, 4):
            x = torch.randn(rows, k, dtype=torch.bfloat16)
            found.append((f"{kind} {layer} rows {rows}", lambda x=x, w=weight: triton_gemv.gemv(x, w)))
    return found
