"""Typed configuration: the model's architecture and the engine's limits.

Both are plain data built once at the edge (CLI flags, config.json, GGUF metadata) and read
everywhere else; nothing inside the engine parses strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagoda_runtime.contract.sizing import ModelArchitecture

# How the decoder projections are held; --quantization auto picks one from the checkpoint
# (quantization_selection.py).
QUANTIZATION_METHODS = ("none", "int8", "int4", "fp8", "awq", "gptq", "gguf")
QUANTIZATION_CHOICES = ("auto", *QUANTIZATION_METHODS)
# auto: the model's dtype; fp8: e4m3, half the bytes of bf16.
KV_CACHE_DTYPES = ("auto", "fp8")
# auto: read the checkpoint --model names; dummy: random weights of the model shape --model names
# (model_catalogue.SHAPES), vLLM's flag of the same name.
LOAD_FORMATS = ("auto", "dummy")


# Hugging Face rope_scaling types the rotary table (kernels/rope_cache.py) implements.
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1 style frequency scaling ("rope_type": "llama3") or linear scaling."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "llama", "mistral" or "qwen2" (model_source.py maps checkpoints onto these)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # Qwen2 puts a bias on q, k and v
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def to_sizing(self) -> ModelArchitecture:
        return ModelArchitecture(
            num_layers=self.num_hidden_layers,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
        )


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    load_format: str = "auto"  # one of LOAD_FORMATS
    dtype: str = "auto"  # auto, float32, float16, bfloat16
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    quantization: str = "auto"  # one of QUANTIZATION_CHOICES
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES
    max_model_len: int | None = None  # None: the model's own limit
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    # Bytes, or a fraction (0, 1] of the device's free memory when <= 1.
    kv_cache_memory: float = 0.9
    # vLLM's budget, used instead of kv_cache_memory when set: this fraction of the GPU's total
    # memory for the process, of which the KV cache gets what the weights leave.
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    # Schedule and launch each step before the previous step's tokens are read, and make their
    # text while the device runs (vLLM's async scheduling); None: on where the device runs apart
    # from the host (CUDA).
    async_scheduling: bool | None = None
    seed: int = 0
    # Ranks the model is split over (tensor_parallel.py); each rank's process builds the engine
    # parts with its own TensorParallel.
    tensor_parallel_size: int = 1
