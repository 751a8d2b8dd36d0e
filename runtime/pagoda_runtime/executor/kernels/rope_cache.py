"""The rotary-embedding table: cos and sin of every (position, frequency) pair, computed once.

The inverse frequencies follow Hugging Face transformers' rope types ("default", "linear",
"llama3") operation for operation, and the table is computed on the CPU in float32 the way
`LlamaRotaryEmbedding.forward` does, so a float32 model reproduces transformers' values exactly.
"""

from __future__ import annotations

import math

import torch

from pagoda_runtime.contract.config import ROPE_TYPES, ModelConfig, RopeScaling


def _inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.architecture.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None or scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    raise ValueError(
        f"rope scaling type {scaling.rope_type!r} is not supported; use a model whose rope_scaling "
        f"is one of {', '.join(ROPE_TYPES)}."
    )


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, the band between blended."""
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / scaling.low_freq_factor
    high_freq_wavelen = old_context_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def build_cos_sin_cache(
    config: ModelConfig, max_position: int, device: torch.device | str, dtype: torch.dtype
) -> torch.Tensor:
    """[max_position, head_dim]: cos(position * inv_freq) in the first half, sin in the second."""
    inv_freq = _inverse_frequencies(config)
    positions = torch.arange(max_position, dtype=torch.int64).float()
    # An outer product written as a matmul, as transformers writes it, so the rounding is the same.
    freqs = (inv_freq[:, None] @ positions[None, :]).t()
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return cache.to(device=device, dtype=dtype)
