"""The PyTorch reference kernels compute what Hugging Face transformers' eager Llama computes."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.contract.config import ModelConfig, RopeScaling
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.executor.kernels import (
    build_cos_sin_cache,
    get_attention_ops,
    reference,
    rms_norm,
    silu_and_mul,
)
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from .paged_batch import dense_attention, make_paged_batch, relative_error

ROPE_VARIANTS = {
    "default": None,
    "linear": RopeScaling("linear", factor=4.0),
    "llama3": RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    ),
    # Qwen 3's recommendation for 4x its context, and DeepSeek's attention factor from mscales.
    "yarn": RopeScaling("yarn", factor=4.0, original_max_position_embeddings=128),
    "yarn_mscale": RopeScaling(
        "yarn",
        factor=40.0,
        original_max_position_embeddings=64,
        mscale=1.0,
        mscale_all_dim=0.8,
        beta_fast=16.0,
    ),
}


def _configs(scaling: RopeScaling | None, head_dim: int = 64) -> tuple[ModelConfig, LlamaConfig]:
    ours = ModelConfig(
        model_type="llama",
        architecture=ModelArchitecture(
            num_hidden_layers=1,
            hidden_size=4 * head_dim,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=head_dim,
            vocab_size=32,
            max_position_embeddings=512,
        ),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=scaling,
    )
    rope = {"rope_type": "default", "rope_theta": ours.rope_theta}
    if scaling is not None:
        rope = {**rope, **{k: v for k, v in vars(scaling).items()}}
    theirs = LlamaConfig(
        hidden_size=ours.architecture.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=512,
        rope_parameters=rope,
    )
    return ours, theirs


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_cos_sin_cache_equals_transformers(variant: str) -> None:
    ours, theirs = _configs(ROPE_VARIANTS[variant])
    cache = build_cos_sin_cache(ours, 300, "cpu", torch.float32)
    positions = torch.arange(300)[None, :]
    cos, sin = LlamaRotaryEmbedding(theirs)(torch.zeros(1, dtype=torch.float32), positions)
    assert torch.equal(cache[:, :32], cos[0, :, :32])
    assert torch.equal(cache[:, 32:], sin[0, :, :32])
    assert torch.equal(cos[0, :, 32:], cos[0, :, :32])  # transformers repeats the same half


def test_llama3_scaling_changes_only_the_long_wavelengths() -> None:
    plain = build_cos_sin_cache(_configs(None)[0], 300, "cpu", torch.float32)
    scaled = build_cos_sin_cache(_configs(ROPE_VARIANTS["llama3"])[0], 300, "cpu", torch.float32)
    assert torch.equal(plain[:, :2], scaled[:, :2])
    assert torch.allclose(plain[:, 63] / 8, scaled[:, 63], rtol=1e-3)  # sin of the slowest, slowed 8x


def test_unknown_rope_type_is_refused() -> None:
    with pytest.raises(ValueError, match="'dynamic' is not supported"):
        build_cos_sin_cache(_configs(RopeScaling("dynamic", factor=2.0))[0], 8, "cpu", torch.float32)


def test_yarn_keeps_fast_frequencies_slows_slow_ones_and_scales_the_table() -> None:
    plain = build_cos_sin_cache(_configs(None)[0], 300, "cpu", torch.float32)
    yarn = build_cos_sin_cache(_configs(ROPE_VARIANTS["yarn"])[0], 300, "cpu", torch.float32)
    scale = 0.1 * torch.log(torch.tensor(4.0)) + 1.0
    torch.testing.assert_close(yarn[:, 0], plain[:, 0] * scale)  # cos of the fastest, kept
    torch.testing.assert_close(yarn[:, 63], plain[:, 63] / 4 * scale, rtol=1e-3, atol=1e-6)  # slowed 4x


def test_rotary_equals_transformers() -> None:
    ours, theirs = _configs(ROPE_VARIANTS["llama3"])
    cache = build_cos_sin_cache(ours, 512, "cpu", torch.float32)
    positions = torch.tensor([0, 5, 6, 7, 300, 1, 511])
    q, k = torch.randn(7, 4, 64), torch.randn(7, 2, 64)
    cos, sin = LlamaRotaryEmbedding(theirs)(q, positions[None, :])
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_out, k_out = reference.rotary(positions, q.clone(), k.clone(), cache)
    assert torch.equal(q_out, q_ref[0].transpose(0, 1))
    assert torch.equal(k_out, k_ref[0].transpose(0, 1))
    # What the model calls: the query rotated in place, the rotated key stored with the value.
    kv_cache, v, slots = (
        torch.zeros(2, 1, 8, 2, 64),
        torch.randn(7, 2, 64),
        torch.tensor([3, 0, 1, 2, 4, 5, 6]),
    )
    q_in = q.clone()
    q_out = get_attention_ops("cpu").rotary_write_kv(positions, q_in, k.clone(), v, cache, kv_cache, slots)
    assert q_out is q_in and torch.equal(q_out, q_ref[0].transpose(0, 1))
    assert torch.equal(kv_cache[0, 0][slots], k_ref[0].transpose(0, 1)) and torch.equal(
        kv_cache[1, 0][slots], v
    )


def test_write_kv_fills_the_named_slots_and_skips_padding() -> None:
    kv_cache = torch.zeros(2, 4, 8, 2, 16)
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    reference.write_kv(k, v, kv_cache, torch.tensor([17, -1, 3]))
    assert torch.equal(kv_cache[0, 2, 1], k[0]) and torch.equal(kv_cache[1, 0, 3], v[2])
    assert int((kv_cache != 0).any(dim=(-1, -2)).sum()) == 4  # two slots, keys and values


@pytest.mark.parametrize("block_size", [1, 8, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
def test_attention_matches_dense_causal_attention(block_size: int, heads: int, kv_heads: int) -> None:
    # Decode steps, a prompt's first chunk, chunks over cached prefixes, a one-token sequence.
    seqs = [(37, 1), (20, 20), (50, 13), (1, 1), (16, 1), (33, 2)]
    batch = make_paged_batch(seqs, heads, kv_heads, 64, block_size, seed=block_size + heads)
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    out = get_attention_ops("cpu").attention(batch.q, batch.kv_cache, batch.meta, 0.125)
    assert relative_error(out, dense_attention(batch, 0.125)) < 1e-5


def test_attention_in_bfloat16_accumulates_in_float32() -> None:
    batch = make_paged_batch([(300, 1), (200, 40)], 8, 2, 64, 16, dtype=torch.bfloat16, seed=3)
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    out = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, dense_attention(batch, 0.125)) < 1e-2


def test_rms_norm_equals_transformers_with_and_without_residual() -> None:
    norm = LlamaRMSNorm(64, eps=1e-6)
    norm.weight.data = torch.randn(64)
    x, residual = torch.randn(5, 64), torch.randn(5, 64)
    normed, summed = rms_norm(x, norm.weight.data, 1e-6)
    assert torch.equal(normed, norm(x)) and summed is x
    normed, summed = rms_norm(x, norm.weight.data, 1e-6, residual)
    assert torch.equal(summed, x + residual) and torch.equal(normed, norm(x + residual))


def test_silu_and_mul_reads_gate_then_up_like_transformers_mlp() -> None:
    _, theirs = _configs(None)
    mlp = LlamaMLP(theirs)
    x = torch.randn(3, theirs.hidden_size)
    gate_up_weight = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    with torch.no_grad():
        out = mlp.down_proj(silu_and_mul(x @ gate_up_weight.t()))
        assert torch.allclose(out, mlp(x), atol=1e-6, rtol=1e-5)
