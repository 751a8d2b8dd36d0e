"""Which quantization a model is served with: the --quantization a user asked for, checked against
how the checkpoint stores its projections. The rule in words: docs/architecture.md#quantization.

Torch-free, so that the operator sizes a variant's pods for the method its runtime will pick.
"""

from __future__ import annotations

from pagoda_runtime.contract.config import QUANTIZATION_CHOICES as CHOICES
from pagoda_runtime.contract.config import QUANTIZATION_METHODS
from pagoda_runtime.contract.sizing import gguf_block_type, gguf_is_packed

STORED_FORMATS = ("awq", "gptq", "gguf")  # formats a checkpoint can hold its projections in
_ONLINE = tuple(m for m in QUANTIZATION_METHODS if m not in STORED_FORMATS)


def cpu_packed_kernels(dtype: str) -> bool:
    """Whether packed projections on the CPU run through torch's bfloat16 int4/int8 kernels
    (quantization/cpu_packed.py): with --dtype auto. An explicit --dtype asks for every matmul in
    that dtype, which the reference (dequantize, then matmul) gives exactly."""
    return dtype == "auto"


def cpu_vocab_dtype(device_type: str, dtype: str) -> str | None:
    """The dtype the embedding and LM head matrices are held in where it is not the model's:
    float16 on the CPU with the packed kernels, since the LM head reads the whole matrix every step
    (a quarter of a batch-1 decode step of the bundled model in float32). Float16, not bfloat16:
    fbgemm's float16 GEMM takes float32 activations and returns float32 logits, where torch's
    bfloat16 matmul on the CPU rounds them to bfloat16 (vocab_parallel.py); and float16 keeps three
    more bits of each weight. The LM head is then held apart from the lookup table, tied or not."""
    return "float16" if device_type == "cpu" and cpu_packed_kernels(dtype) else None


def select_quantization(
    requested: str,
    stored: str | None,
    device_type: str,
    source: str,
    dtype: str = "auto",
    gguf_block: str | None = None,
) -> str:
    """The method to build the model's projections with.

    stored: "awq", "gptq" or "gguf" when the checkpoint holds its projections in that format (a
    compressed-tensors INT4 one as "gptq"), "fp8" or "int8" for FP8 or INT8 ones (dequantized at
    load: loading/fp8_blocks.py, loading/compressed_tensors.py), None for float weights;
    device_type: "cpu" or "cuda"; source names the model in messages (and, for a GGUF file, its
    type unless gguf_block gives it); dtype: the --dtype asked for ("auto" or a float type);
    gguf_block: a GGUF file's sizing.GGUF_FILE_TYPES name, as read from its tensors.
    """
    if requested not in CHOICES:
        raise ValueError(f"unknown quantization {requested!r}; use one of {', '.join(CHOICES)}")
    if stored in ("awq", "gptq"):
        if requested not in ("auto", stored):
            raise ValueError(
                f"{source} holds {stored.upper()} 4-bit weights, which Pagoda serves only as they are; "
                f"use --quantization {stored} or auto"
            )
        return stored
    if stored in ("fp8", "int8"):
        # FP8 and INT8 weights arrive dequantized; auto holds them in 8 bits again, as saved.
        if requested in STORED_FORMATS:
            raise ValueError(
                f"{source} holds {stored.upper()} weights, not {requested.upper()} ones; "
                f"use --quantization auto or {', '.join(_ONLINE)}"
            )
        return stored if requested == "auto" else requested
    if stored == "gguf":
        if requested == "auto":
            # A file whose projections are mostly of a block type without a packed layout (Q5_K_M,
            # Q3_K_M, F16) is dequantized at load. Without the CPU kernels a packed matmul
            # dequantizes its weight at every step (decode of the bundled model measured 8x slower
            # than float32): then the file is dequantized once at load instead.
            if not gguf_is_packed(gguf_block or gguf_block_type(source)):
                return "none"
            return "gguf" if device_type == "cuda" or cpu_packed_kernels(dtype) else "none"
        if requested in ("awq", "gptq"):
            raise ValueError(
                f"{source} holds GGUF blocks, not {requested.upper()} weights; "
                f"use --quantization gguf, auto, {', '.join(_ONLINE)}"
            )
        return requested
    if requested == "auto":
        return "none"
    if requested in STORED_FORMATS:
        raise ValueError(
            f"{source} holds float weights, so there are no {requested.upper()} blocks to load; "
            f"use --quantization {', '.join(_ONLINE)} or auto, or a {requested.upper()} checkpoint"
        )
    return requested
