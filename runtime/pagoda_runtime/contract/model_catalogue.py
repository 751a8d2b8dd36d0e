"""The models Pagoda knows by name, with the architecture their config.json gives.

One catalogue for everything that needs a model's shape without its checkpoint: the operator
sizes pods for an InferenceService's `family` from it (through `KNOWN_ARCHITECTURES`, the part
sizing.py reads); the benchmarks and `pagoda-runtime serve --load-format dummy` build random-weight
models of these shapes (random_model.py). Torch-free, so the operator can import it and serve can
refuse an unknown shape before torch loads.
"""

from __future__ import annotations

from pagoda_runtime.contract.config import ModelConfig, RopeScaling
from pagoda_runtime.contract.sizing import ModelArchitecture

# Llama 3.1 and 3.2 stretch the 8K-trained rotary frequencies to 128K.
_LLAMA31_ROPE = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
_LLAMA32_ROPE = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
_QWEN2 = {"rms_norm_eps": 1e-6, "attention_bias": True}


def model_config(
    architecture: str,
    num_layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    tied: bool,
    max_len: int,
    rope_theta: float,
    *,
    rms_norm_eps: float = 1e-5,
    attention_bias: bool = False,
    rope_scaling: RopeScaling | None = None,
) -> ModelConfig:
    """A ModelConfig from the numbers a model card lists, in the order the table below gives them."""
    return ModelConfig(
        architecture=architecture,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=rms_norm_eps,
        rope_theta=rope_theta,
        max_position_embeddings=max_len,
        tie_word_embeddings=tied,
        attention_bias=attention_bias,
        rope_scaling=rope_scaling,
    )


# layers, hidden, intermediate, heads, KV heads, head dim, vocabulary, tied embeddings, context, RoPE theta
MODELS: dict[str, ModelConfig] = {
    "llama-3-8b": model_config("llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 8192, 500000.0),
    "llama-3.1-8b": model_config(
        "llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 131072, 500000.0, rope_scaling=_LLAMA31_ROPE
    ),
    "llama-3.2-1b": model_config(
        "llama", 16, 2048, 8192, 32, 8, 64, 128256, True, 131072, 500000.0, rope_scaling=_LLAMA32_ROPE
    ),
    "llama-3.2-3b": model_config(
        "llama", 28, 3072, 8192, 24, 8, 128, 128256, True, 131072, 500000.0, rope_scaling=_LLAMA32_ROPE
    ),
    "llama-3-70b": model_config("llama", 80, 8192, 28672, 64, 8, 128, 128256, False, 8192, 500000.0),
    "llama-3.1-70b": model_config(
        "llama", 80, 8192, 28672, 64, 8, 128, 128256, False, 131072, 500000.0, rope_scaling=_LLAMA31_ROPE
    ),
    "mistral-7b": model_config("mistral", 32, 4096, 14336, 32, 8, 128, 32768, False, 32768, 1000000.0),
    "qwen2.5-1.5b": model_config("qwen2", 28, 1536, 8960, 12, 2, 128, 151936, True, 32768, 1e6, **_QWEN2),
    "qwen2.5-7b": model_config("qwen2", 28, 3584, 18944, 28, 4, 128, 152064, False, 32768, 1e6, **_QWEN2),
    "smollm2-135m": model_config("llama", 30, 576, 1536, 9, 3, 64, 49152, True, 8192, 100000.0),
    "smollm2-360m": model_config("llama", 32, 960, 2560, 15, 5, 64, 49152, True, 8192, 100000.0),
    "smollm2-1.7b": model_config("llama", 24, 2048, 8192, 32, 32, 64, 49152, True, 8192, 130000.0),
}

KNOWN_ARCHITECTURES: dict[str, ModelArchitecture] = {name: c.to_sizing() for name, c in MODELS.items()}

# Every model above, and one small enough for quick runs and tests on the CPU: the shapes
# random_model.py builds (`bench --shape`, `serve --load-format dummy --model`).
SHAPES: dict[str, ModelConfig] = {
    **MODELS,
    "tiny-llama": model_config("llama", 2, 64, 128, 4, 2, 16, 512, False, 2048, 10000.0),
}


def shape_config(name: str) -> ModelConfig:
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
    return SHAPES[name]
