"""The models Pagoda knows by name, with the architecture their config.json gives.

One catalogue for everything that needs a model's shape without its checkpoint: the operator
sizes pods for an InferenceService's `family` from it (through `KNOWN_ARCHITECTURES`, the part
sizing.py reads); the benchmarks and `pagoda-runtime serve --load-format dummy` build random-weight
models of these shapes (random_model.py). Torch-free, so the operator can import it and serve can
refuse an unknown shape before torch loads. Each entry reads like its config.json: the same names,
the same numbers.
"""

from __future__ import annotations

from pagoda_runtime.contract.config import ModelConfig, RopeScaling
from pagoda_runtime.contract.sizing import ModelArchitecture

# Llama 3.1 and 3.2 stretch the 8K-trained rotary frequencies to 128K.
_LLAMA31_ROPE = RopeScaling(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
_LLAMA32_ROPE = RopeScaling(
    rope_type="llama3",
    factor=32.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)

MODELS: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=32,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
    ),
    "llama-3.1-8b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=32,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
    ),
    "llama-3.2-1b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=16,
            hidden_size=2048,
            intermediate_size=8192,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA32_ROPE,
    ),
    "llama-3.2-3b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=28,
            hidden_size=3072,
            intermediate_size=8192,
            num_attention_heads=24,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA32_ROPE,
    ),
    "llama-3-70b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=80,
            hidden_size=8192,
            intermediate_size=28672,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
    ),
    "llama-3.1-70b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=80,
            hidden_size=8192,
            intermediate_size=28672,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
    ),
    "mistral-7b": ModelConfig(
        model_type="mistral",
        architecture=ModelArchitecture(
            num_hidden_layers=32,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=32768,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
        ),
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
    ),
    "qwen2.5-1.5b": ModelConfig(
        model_type="qwen2",
        architecture=ModelArchitecture(
            num_hidden_layers=28,
            hidden_size=1536,
            intermediate_size=8960,
            num_attention_heads=12,
            num_key_value_heads=2,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
    ),
    "qwen2.5-7b": ModelConfig(
        model_type="qwen2",
        architecture=ModelArchitecture(
            num_hidden_layers=28,
            hidden_size=3584,
            intermediate_size=18944,
            num_attention_heads=28,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=152064,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
            attention_bias=True,
        ),
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
    ),
    "smollm2-135m": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=30,
            hidden_size=576,
            intermediate_size=1536,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            vocab_size=49152,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    ),
    "smollm2-360m": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=32,
            hidden_size=960,
            intermediate_size=2560,
            num_attention_heads=15,
            num_key_value_heads=5,
            head_dim=64,
            vocab_size=49152,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    ),
    "smollm2-1.7b": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=24,
            hidden_size=2048,
            intermediate_size=8192,
            num_attention_heads=32,
            num_key_value_heads=32,
            head_dim=64,
            vocab_size=49152,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
        rms_norm_eps=1e-5,
        rope_theta=130000.0,
    ),
}

KNOWN_ARCHITECTURES: dict[str, ModelArchitecture] = {name: c.architecture for name, c in MODELS.items()}

# Every model above, and one small enough for quick runs and tests on the CPU: the shapes
# random_model.py builds (`bench --shape`, `serve --load-format dummy --model`).
SHAPES: dict[str, ModelConfig] = {
    **MODELS,
    "tiny-llama": ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=512,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        ),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ),
}


def shape_config(name: str) -> ModelConfig:
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
    return SHAPES[name]
