"""The rotary tables of the new families equal transformers' cos and sin: Phi-3's LongRoPE (short
factors before the original context, long ones from it on, both scaled by the attention factor;
half of each head rotated), Gemma 3's and OLMo 3's two tables (the global layers' scaled one, the
local layers' own), a Qwen 3 config asking for YaRN, and DeepSeek V3's YaRN over the rotated part
of its heads with the softmax scale its mscale_all_dim implies."""

from pathlib import Path

import pytest
import torch
from pagoda_runtime.executor.kernels.rope_cache import build_cos_sin_cache, rotary_row_order
from pagoda_runtime.loading.model_source import config_from_hf
from transformers import Olmo3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.olmo3.modeling_olmo3 import Olmo3RotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from tests.runtime.tiny_models import _SIZES, FAMILY_VARIANTS

CONTEXT = 160


def _configs(variant: str, architecture: str):
    config_class, _, extra = FAMILY_VARIANTS[variant]
    hf = config_class(**{**_SIZES, **extra}, vocab_size=64)
    return hf, config_from_hf({**hf.to_dict(), "architectures": [architecture]}, Path("config.json"))


def _hf_table(rotary, positions: list[int], **kwargs) -> torch.Tensor:
    cos, sin = rotary(torch.zeros(1), torch.tensor([positions]), **kwargs)
    half = cos.shape[-1] // 2
    return torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1)


def test_longrope_rotates_with_short_factors_before_the_original_context_and_long_ones_after():
    hf, ours = _configs("phi3", "Phi3ForCausalLM")
    original = ours.rope_scaling.original_max_position_embeddings
    table = build_cos_sin_cache(ours, CONTEXT, "cpu", torch.float32)
    rotated = ours.rotary_dim // 2
    half = ours.architecture.head_dim // 2
    short = _hf_table(Phi3RotaryEmbedding(hf), list(range(original)))  # transformers: short factors
    long = _hf_table(Phi3RotaryEmbedding(hf), list(range(original, CONTEXT)))  # past it: long ones
    for rows, expected in ((slice(0, original), short), (slice(original, CONTEXT), long)):
        torch.testing.assert_close(table[rows, :rotated], expected[:, :rotated], rtol=0, atol=0)
        torch.testing.assert_close(table[rows, half : half + rotated], expected[:, rotated:], rtol=0, atol=0)
        # The dimensions left unrotated: cos 1, sin 0.
        assert bool((table[rows, rotated:half] == 1).all() and (table[rows, half + rotated :] == 0).all())
    order = rotary_row_order(ours)
    assert sorted(order.tolist()) == list(range(ours.architecture.head_dim))


def test_gemma3_local_layers_rotate_with_their_own_base_and_global_ones_with_the_scaled_one():
    hf, ours = _configs("gemma3", "Gemma3ForCausalLM")
    rotary = Gemma3RotaryEmbedding(hf)
    positions = list(range(CONTEXT))
    for local, layer_type in ((False, "full_attention"), (True, "sliding_attention")):
        table = build_cos_sin_cache(ours, CONTEXT, "cpu", torch.float32, local=local)
        torch.testing.assert_close(table, _hf_table(rotary, positions, layer_type=layer_type), rtol=0, atol=0)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        # Qwen's own advice for four times Qwen 3's context, as config.json or --hf-overrides gives it.
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        # The older spelling, and original_max_position_embeddings left to the config's.
        {"type": "yarn", "factor": 2.0},
    ],
)
def test_a_yarn_config_rotates_as_transformers_does(rope_scaling):
    config_class, _, extra = FAMILY_VARIANTS["qwen3"]
    hf = config_class(**{**_SIZES, **extra, "rope_scaling": rope_scaling}, vocab_size=64)
    raw = {**hf.to_dict(), "architectures": ["Qwen3ForCausalLM"]}
    raw.pop("rope_parameters")
    ours = config_from_hf({**raw, "rope_theta": 1000000.0, "rope_scaling": rope_scaling}, Path("config.json"))
    assert ours.rope_scaling.rope_type == "yarn"
    table = build_cos_sin_cache(ours, CONTEXT, "cpu", torch.float32)
    expected = _hf_table(Qwen3RotaryEmbedding(hf), list(range(CONTEXT)))
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


def test_olmo3_released_configs_scale_the_full_layers_rope_only():
    """OLMo 3's config.json: rope_theta and a YaRN rope_scaling, which transformers (and vLLM) apply
    to the full-attention layers alone; the sliding-window layers rotate with plain RoPE."""
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32}
    types = ["sliding_attention", "full_attention"]
    raw = {
        **_SIZES,
        "architectures": ["Olmo3ForCausalLM"],
        "vocab_size": 64,
        "sliding_window": 8,
        "layer_types": types,
        "rope_theta": 500000.0,
        "rope_scaling": yarn,
    }
    ours = config_from_hf(raw, Path("config.json"))
    hf = Olmo3Config(**{k: v for k, v in raw.items() if k != "architectures"})
    rotary = Olmo3RotaryEmbedding(hf)
    positions = list(range(CONTEXT))
    for local, layer_type in ((False, "full_attention"), (True, "sliding_attention")):
        table = build_cos_sin_cache(ours, CONTEXT, "cpu", torch.float32, local=local)
        torch.testing.assert_close(table, _hf_table(rotary, positions, layer_type=layer_type), rtol=0, atol=0)


def test_deepseek_rotates_its_rope_dimensions_and_scales_the_softmax_as_transformers_does():
    hf, ours = _configs("deepseek_v3", "DeepseekV3ForCausalLM")
    table = build_cos_sin_cache(ours, CONTEXT, "cpu", torch.float32)
    rotated, half = ours.rotary_dim // 2, ours.architecture.attention_head_dim // 2
    assert rotated == hf.qk_rope_head_dim // 2
    expected = _hf_table(DeepseekV3RotaryEmbedding(hf), list(range(CONTEXT)))
    torch.testing.assert_close(table[:, :rotated], expected[:, :rotated], rtol=0, atol=0)
    torch.testing.assert_close(table[:, half : half + rotated], expected[:, rotated:], rtol=0, atol=0)
    assert bool((table[:, rotated:half] == 1).all() and (table[:, half + rotated :] == 0).all())
    assert ours.attention_scale == pytest.approx(DeepseekV3Attention(hf, 0).scaling, rel=1e-12)
    assert ours.attention_scale != ours.architecture.head_dim**-0.5
