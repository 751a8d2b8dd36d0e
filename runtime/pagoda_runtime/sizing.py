"""How many bytes a model needs: weights per quantization, KV cache per token, and whether it fits.

One function for both halves of Pagoda: the runtime reports these numbers at start-up and the
operator refuses to create pods for a variant that cannot fit. Torch-free on purpose, so that the
operator can import it.

Only the linear layers of the decoder blocks are quantized (as in vLLM, AWQ and GPTQ); the
embeddings, the LM head and the norms stay in the model's float dtype (bf16 unless told otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pagoda_runtime.bundled import BUNDLED_FILE, BUNDLED_MODEL_NAME

GIB = 1024**3
# CUDA context, activations of one max-size batch, sampler buffers and CUDA graphs; measured
# footprints of an 8B model beyond weights and KV stay under this.
DEFAULT_OVERHEAD_BYTES = 2 * GIB


@dataclass(frozen=True)
class ModelArchitecture:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of the quantizable linear layers of one decoder block."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        h, i = self.hidden_size, self.intermediate_size
        return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]

    def unquantized_parameters(self) -> int:
        """Embeddings, LM head, norms and attention biases: kept in 16 bits by every variant."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * self.hidden_size
        biases = (
            (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        )
        return embeddings + norms + biases * self.num_layers

    def num_parameters(self) -> int:
        linear = sum(out * inp for out, inp in self.linear_shapes()) * self.num_layers
        return linear + self.unquantized_parameters()


def fitted_group_size(in_features: int, preferred: int) -> int:
    """The largest power of two up to `preferred` that divides in_features: the group a layer of that
    width really gets (SmolLM2-135M's 576 inputs take int4 groups of 64, not 128)."""
    size = preferred
    while in_features % size:
        size //= 2
    return size


@dataclass(frozen=True)
class WeightFormat:
    """Storage of a quantized linear layer: packed weights plus per-group and per-row metadata."""

    bits: int
    group_size: int = 0  # 0: no groups
    group_bytes: float = 0.0  # scale (+ zero point) stored per group of group_size inputs
    row_bytes: float = 0.0  # per output channel (per-channel scales)

    def linear_bytes(self, out_features: int, in_features: int) -> float:
        groups = 0
        if self.group_size:
            groups = out_features * (in_features // fitted_group_size(in_features, self.group_size))
        return (
            out_features * in_features * self.bits / 8
            + groups * self.group_bytes
            + out_features * self.row_bytes
        )


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "none": WeightFormat(bits=16),
    "bf16": WeightFormat(bits=16),
    "fp16": WeightFormat(bits=16),
    "float32": WeightFormat(bits=32),
    "int8": WeightFormat(bits=8, row_bytes=2),  # symmetric, one fp16 scale per output channel
    "fp8": WeightFormat(bits=8, row_bytes=4),  # e4m3, one float32 scale per output channel
    # Asymmetric groups of 128: an fp16 scale and an fp16 zero point per group.
    "int4": WeightFormat(bits=4, group_size=128, group_bytes=4),
    # AWQ and GPTQ checkpoints are converted at load to that int4 layout: their 4-bit zero points
    # become fp16 offsets and GPTQ's g_idx (refused unless trivial) is dropped.
    "awq": WeightFormat(bits=4, group_size=128, group_bytes=4),
    "gptq": WeightFormat(bits=4, group_size=128, group_bytes=4),
    # A GGUF file of 4-bit blocks; weight_bytes' gguf_block names the file's real block type.
    "gguf": WeightFormat(bits=4, group_size=32, group_bytes=4),
}
# GGUF blocks kept packed (quantization/gguf_blocks.py): Q4_0 and Q4_1 as int4 groups of 32 with an
# fp16 scale and an fp16 offset each, Q8_0 as int8 groups of 32 with an fp16 scale: 8.5 bits, not 5.
GGUF_BLOCK_FORMATS: dict[str, WeightFormat] = {
    "Q4_0": WEIGHT_FORMATS["gguf"],
    "Q4_1": WEIGHT_FORMATS["gguf"],
    "Q8_0": WeightFormat(bits=8, group_size=32, group_bytes=2),
}
# A GGUF source whose name does not say its block type is sized as the largest, never too small.
LARGEST_GGUF_BLOCK = "Q8_0"

# Bytes of one element of the tensors a model keeps unquantized, by the runtime's --dtype names.
FLOAT_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


def gguf_block_type(source: str) -> str:
    """The block type a GGUF source holds, as far as its file name tells (`model.Q8_0.gguf`,
    `model-Q4_0.gguf`; the bundled model is Q4_1); LARGEST_GGUF_BLOCK when it does not tell."""
    name = BUNDLED_FILE if source.split("://", 1)[-1] == BUNDLED_MODEL_NAME else source
    file_name = name.rsplit("/", 1)[-1].upper()
    named = (b for b in GGUF_BLOCK_FORMATS if re.search(rf"(?<![A-Z0-9]){b}(?![A-Z0-9_])", file_name))
    return next(named, LARGEST_GGUF_BLOCK)


def weight_bytes(
    arch: ModelArchitecture, quantization: str, float_dtype: str = "bfloat16", gguf_block: str | None = None
) -> int:
    """float_dtype: what the unquantized tensors are held in (every tensor, for "none");
    gguf_block: for "gguf", the file's block type (Q4_0, Q4_1, Q8_0) when it is known."""
    if quantization not in WEIGHT_FORMATS:
        raise ValueError(
            f"unknown quantization {quantization!r}; use one of {', '.join(sorted(WEIGHT_FORMATS))}"
        )
    if float_dtype not in FLOAT_DTYPE_BYTES:
        raise ValueError(f"unknown dtype {float_dtype!r}; use one of {', '.join(FLOAT_DTYPE_BYTES)}")
    float_bytes = 4 if quantization == "float32" else FLOAT_DTYPE_BYTES[float_dtype]
    fmt = WeightFormat(bits=8 * float_bytes) if quantization == "none" else WEIGHT_FORMATS[quantization]
    if quantization == "gguf" and gguf_block is not None:
        fmt = GGUF_BLOCK_FORMATS[gguf_block]
    linear = sum(fmt.linear_bytes(out, inp) for out, inp in arch.linear_shapes()) * arch.num_layers
    return int(linear + arch.unquantized_parameters() * float_bytes)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str = "auto") -> int:
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV cache dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPE_BYTES)}")
    return 2 * num_layers * num_kv_heads * head_dim * KV_DTYPE_BYTES[kv_dtype]


def kv_bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, kv_dtype: str = "auto"
) -> int:
    return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, kv_dtype)


@dataclass(frozen=True)
class FitResult:
    fits: bool
    weight_bytes: int
    kv_bytes: int  # one sequence of max_model_len tokens
    overhead_bytes: int
    capacity_bytes: int

    @property
    def required_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.overhead_bytes

    def describe(self) -> str:
        verdict = "fits in" if self.fits else "does not fit in"
        return (
            f"needs {self.required_bytes / GIB:.1f} GiB (weights {self.weight_bytes / GIB:.1f} GiB, "
            f"KV for one full-length sequence {self.kv_bytes / GIB:.2f} GiB, overhead "
            f"{self.overhead_bytes / GIB:.1f} GiB), which {verdict} {self.capacity_bytes / GIB:.1f} GiB"
        )


def fits(
    arch: ModelArchitecture,
    quantization: str,
    max_model_len: int,
    capacity_bytes: int,
    *,
    kv_dtype: str = "auto",
    gguf_block: str | None = None,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
) -> FitResult:
    """Whether the weights plus the KV cache of one max_model_len sequence fit the device memory."""
    weights = weight_bytes(arch, quantization, gguf_block=gguf_block)
    kv = max_model_len * kv_bytes_per_token(arch.num_layers, arch.num_kv_heads, arch.head_dim, kv_dtype)
    return FitResult(
        fits=weights + kv + overhead_bytes <= capacity_bytes,
        weight_bytes=weights,
        kv_bytes=kv,
        overhead_bytes=overhead_bytes,
        capacity_bytes=capacity_bytes,
    )
