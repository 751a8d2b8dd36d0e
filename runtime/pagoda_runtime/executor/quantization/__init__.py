"""Weight quantization: packed layouts, online quantizers, checkpoint converters and the matmuls."""

# First, so that the Triton kernel modules below are decorated compiled or interpreted as it decides.
from pagoda_runtime.executor import triton_mode  # noqa: F401
from pagoda_runtime.executor.quantization.gguf_blocks import gguf_to_packed
from pagoda_runtime.executor.quantization.hf_checkpoints import (
    CheckpointQuantization,
    awq_to_packed,
    gptq_to_packed,
    parse_quantization_config,
)
from pagoda_runtime.executor.quantization.linear import (
    DenseLinear,
    QuantizedLinear,
    make_linear,
)
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8
from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize

__all__ = [
    "CheckpointQuantization",
    "DenseLinear",
    "PackedWeight",
    "QuantizedLinear",
    "awq_to_packed",
    "dequantize",
    "gguf_to_packed",
    "gptq_to_packed",
    "make_linear",
    "parse_quantization_config",
    "quantize_fp8",
    "quantize_int4",
    "quantize_int8",
]
