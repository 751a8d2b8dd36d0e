"""Multi-head latent attention served absorbed: a one-plane cache holds each token's latent, read
as the key and as the value of one KV head that every query head attends to; nothing writes a
second plane. The Triton kernels compute it as the reference does (compiled on a GPU, interpreted
on a CPU), and a DeepSeek engine caches one latent a token and layer, fp8 too, where the naive form
cached every head's key and value."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from pagoda_runtime import LLM
from pagoda_runtime.contract.sizing import kv_bytes_per_token
from pagoda_runtime.executor.kernels import reference, triton_paged_attention
from pagoda_runtime.executor.kernels.triton_paged_attention import paged_attention
from pagoda_runtime.executor.kernels.triton_rotary_kv_write import rotary_write_kv

from tests.runtime.tiny_models import build_tiny_model

from .paged_batch import dense_attention, make_paged_batch, relative_error
from .test_triton_kernels import MIXED, _cos_sin_cache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# A latent of 64 and a rotated key of 8: a width that is no power of two, as DeepSeek's 512 + 64.
WIDTH = 72


def _one_plane(batch):
    """The batch with a one-plane cache whose keys are the values too, this step's keys written."""
    cache = batch.kv_cache[:1].clone()
    reference.write_kv(batch.k_new, None, cache, batch.meta.slot_mapping)
    return replace(batch, kv_cache=cache, v_new=None, values=batch.keys)


@pytest.mark.parametrize("heads,num_splits", [(16, None), (8, 3)])
def test_every_query_head_attends_to_the_one_latent_plane_as_keys_and_values(heads, num_splits):
    batch = _one_plane(make_paged_batch(MIXED, heads, 1, WIDTH, 16, device=DEVICE, seed=heads))
    scale = 0.1
    expected = dense_attention(batch, scale)
    assert relative_error(reference.attention(batch.q, batch.kv_cache, batch.meta, scale), expected) < 1e-5
    out = paged_attention(
        batch.q, batch.kv_cache, batch.meta, scale, num_splits=num_splits, min_split_tokens=16
    )
    assert relative_error(out, expected) < 1e-5


def test_wide_heads_run_a_few_query_heads_at_a_time_to_the_same_result():
    # Wider than WIDE_HEAD_DIM: 40 query heads over one latent go as 16, 16 and 8 (DeepSeek V3's
    # 128 heads on one GPU as 8 launches), prefill chunks in narrow tiles too.
    width = triton_paged_attention.WIDE_HEAD_DIM + 8
    batch = _one_plane(make_paged_batch(MIXED, 40, 1, width, 16, device=DEVICE, seed=5))
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.05)
    assert relative_error(out, dense_attention(batch, 0.05)) < 1e-5


@pytest.mark.parametrize("fp8", [False, True])
def test_the_rotary_write_stores_the_keys_alone_in_a_one_plane_cache(fp8):
    positions = torch.tensor([0, 1, 2, 1000, 2047], device=DEVICE)
    q = torch.randn(5, 6, WIDTH, device=DEVICE)
    k = torch.randn(5, 1, WIDTH, device=DEVICE) * 10
    dtype = reference.FP8_KV_DTYPE if fp8 else torch.float32
    cache = torch.zeros(1, 6, 8, 1, WIDTH, device=DEVICE).to(dtype)
    scales = torch.tensor([[0.5], [0.5]], device=DEVICE) if fp8 else None
    expected_cache, expected_q = cache.clone(), q.clone()
    slots = torch.tensor([3, -1, 47, 8, 0], device=DEVICE)
    cos_sin = _cos_sin_cache(WIDTH)
    reference.rotary_write_kv(
        positions, expected_q, k.clone(), None, cos_sin, expected_cache, slots, None, scales
    )
    rotary_write_kv(positions, q, k, None, cos_sin, cache, slots, None, scales)
    assert torch.allclose(q, expected_q, atol=1e-5)
    if fp8:
        assert torch.equal(cache.view(torch.uint8), expected_cache.view(torch.uint8))
    else:
        assert torch.allclose(cache, expected_cache, atol=1e-5)
    # Token 0, at position 0, rotates by nothing: its slot holds its key (divided by the scale).
    stored = cache[0].flatten(0, 1)[3].float()
    assert torch.allclose(stored, k[0] / (0.5 if fp8 else 1), rtol=0.07, atol=0.01)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "deepseek_v3", "deepseek_v3")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_a_deepseek_engine_caches_one_latent_a_token_and_layer(deepseek, kv_cache_dtype):
    engine = LLM(
        str(deepseek), dtype="float32", device="cpu", kv_cache_memory=2**20, kv_cache_dtype=kv_cache_dtype
    ).engine
    arch = engine.model_config.architecture
    width = arch.kv_lora_rank + arch.qk_rope_head_dim
    element = 1 if kv_cache_dtype == "fp8" else 4
    for cache in engine.runner.kv_caches:
        assert cache.shape == (1, engine.runner.num_blocks, engine.runner.block_size, 1, width)
    per_token = arch.num_hidden_layers * width * element
    assert kv_bytes_per_token(arch, "fp8" if kv_cache_dtype == "fp8" else "float32") == per_token
    assert engine.memory.kv_bytes_per_block == engine.runner.block_size * per_token
    # Every head's key and zero-padded value would have cost 2 x heads x head_dim a layer.
    assert 2 * arch.num_attention_heads * arch.head_dim > 2 * width
    if kv_cache_dtype == "fp8":
        for layer in engine.runner.model.layers:
            keys, values = layer.self_attn.kv_scales
            assert torch.equal(keys, values)  # the values are the keys' plane, stored once
