"""The rotary-embedding table: cos and sin of every (position, frequency) pair, computed once.

The inverse frequencies follow Hugging Face transformers' rope types ("default", "linear",
"llama3", "longrope", "yarn") operation for operation, and the table is computed on the CPU in float32 the
way the models' rotary embeddings do, so a float32 model reproduces transformers' values exactly.

LongRoPE (Phi-3) rotates with its short factors up to original_max_position_embeddings and with its
long factors past it, position by position: a key keeps the rotation it was cached with, so the
cache and prefix sharing stay exact. (transformers switches a whole forward to the long factors
once its longest position passes the original context, so a prompt longer than that differs.)

Partial rotary embeddings (Phi-4-mini rotates 3/4 of each head) keep the table head_dim wide: the
rotated pairs come first in each half and the rest get cos 1 and sin 0, which the model matches by
permuting each head's q and k rows as it loads them (rotary_row_order).
"""

from __future__ import annotations

import math

import torch

from pagoda_runtime.contract.config import ROPE_TYPES, ModelConfig, RopeScaling


def _inverse_frequencies(theta: float, dim: int, scaling: RopeScaling | None, factors=None) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    if factors is not None:
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**exponents)
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None or scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    if scaling.rope_type == "yarn":
        return _yarn_frequencies(theta, exponents, scaling)
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


def _yarn_frequencies(theta: float, exponents: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than beta_slow times over the original context are
    interpolated (divided by factor), those that turn more than beta_fast times kept, a linear ramp
    over the dimensions between. exponents: 2i / dim for each pair i."""
    dim = 2 * exponents.shape[0]

    def dimension(rotations: float) -> float:
        context = scaling.original_max_position_embeddings
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    kept = 1 - ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    wavelengths = theta**exponents
    return 1.0 / (scaling.factor * wavelengths) * (1 - kept) + 1.0 / wavelengths * kept


def _yarn_attention_factor(scaling: RopeScaling) -> float:
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return scaling.yarn_mscale(scaling.mscale) / scaling.yarn_mscale(scaling.mscale_all_dim)
    return scaling.yarn_mscale()


def _longrope_attention_factor(scaling: RopeScaling) -> float:
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scaling.factor) / math.log(scaling.original_max_position_embeddings))


def _table(inv_freq: torch.Tensor, positions: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    # An outer product written as a matmul, as transformers writes it, so the rounding is the same.
    freqs = (inv_freq[:, None] @ positions[None, :]).t()
    cos, sin = freqs.cos(), freqs.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos, sin


def build_cos_sin_cache(
    config: ModelConfig,
    max_position: int,
    device: torch.device | str,
    dtype: torch.dtype,
    local: bool = False,
) -> torch.Tensor:
    """[max_position, attention_head_dim]: cos(position * inv_freq) in the first half, sin in the
    second.

    local: the table of the sliding-window layers (config.local_rope_theta, unscaled)."""
    theta, scaling = config.rope_theta, config.rope_scaling
    if local:
        theta, scaling = config.local_rope_theta, None
    dim = config.rotary_dim
    positions = torch.arange(max_position, dtype=torch.int64).float()
    if scaling is not None and scaling.rope_type == "longrope":
        scale = _longrope_attention_factor(scaling)
        short = _table(_inverse_frequencies(theta, dim, None, scaling.short_factor), positions, scale)
        long = _table(_inverse_frequencies(theta, dim, None, scaling.long_factor), positions, scale)
        is_long = (positions >= scaling.original_max_position_embeddings)[:, None]
        cos, sin = (torch.where(is_long, lo, sh) for sh, lo in zip(short, long, strict=True))
    else:
        yarn = scaling is not None and scaling.rope_type == "yarn"
        scale = _yarn_attention_factor(scaling) if yarn else 1.0
        cos, sin = _table(_inverse_frequencies(theta, dim, scaling), positions, scale)
    unrotated = config.architecture.attention_head_dim // 2 - dim // 2
    if unrotated:
        cos = torch.cat((cos, torch.ones(max_position, unrotated)), dim=-1)
        sin = torch.cat((sin, torch.zeros(max_position, unrotated)), dim=-1)
    return torch.cat((cos, sin), dim=-1).to(device=device, dtype=dtype)


def rotary_row_order(config: ModelConfig) -> torch.Tensor | None:
    """The order a head's q and k rows are held in so that the full-width table rotates only the
    first rotary_dim dimensions: rotated pairs (i, i + rotary_dim / 2) at (i, i + head_dim / 2), the
    rest after them in each half; with interleaved pairs (Cohere, GLM-4), each pair's two rows split
    into the two halves. None when the whole head is rotated as halves."""
    head_dim, rotary = config.architecture.head_dim, config.rotary_dim
    if rotary == head_dim and not config.rope_interleaved:
        return None
    half, rotary_half, rest = head_dim // 2, rotary // 2, head_dim - rotary
    # A rotated pair's two rows: (i, i + rotary_dim / 2), or interleaved (2i, 2i + 1) (Cohere,
    # GLM-4), moved to (i, i + head_dim / 2), where the table rotates them.
    if config.rope_interleaved:
        pairs = list(range(0, rotary, 2)), list(range(1, rotary, 2))
    else:
        pairs = list(range(rotary_half)), list(range(rotary_half, rotary))
    first = pairs[0] + [rotary + j for j in range(rest // 2)]
    second = pairs[1] + [rotary + rest // 2 + j for j in range(rest // 2)]
    assert len(first) == len(second) == half
    return torch.tensor(first + second)
