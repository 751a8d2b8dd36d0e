"""On a CUDA GPU, in bf16 and fp16, the Triton kernels compute what the float32 reference computes."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.kernels import build_cos_sin_cache, get_attention_ops, reference
from pagoda_runtime.executor.kernels.triton_paged_attention import max_splits, paged_attention
from pagoda_runtime.executor.kernels.triton_rmsnorm import rms_norm
from pagoda_runtime.executor.kernels.triton_silu_mul import silu_and_mul

from .paged_batch import dense_attention, make_paged_batch, relative_error

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16]


def _batch(seqs, heads, kv_heads, head_dim, block_size, dtype, seed=0):
    batch = make_paged_batch(
        seqs, heads, kv_heads, head_dim, block_size, dtype=dtype, device="cuda", seed=seed
    )
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    return batch


def _reference(batch, scale):
    return reference.attention(batch.q.float(), batch.kv_cache.float(), batch.meta, scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (9, 3, 64), (14, 2, 64)])
def test_mixed_batch(dtype, block_size, heads, kv_heads, head_dim) -> None:
    seqs = [(700, 1), (129, 1), (512, 512), (1500, 300), (3, 1), (64, 2)]
    batch = _batch(seqs, heads, kv_heads, head_dim, block_size, dtype, seed=block_size)
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, head_dim**-0.5)
    assert out.dtype == dtype
    assert relative_error(out, _reference(batch, head_dim**-0.5)) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_seqs", [1, 3, 64])
def test_long_context_decode_with_default_splits(dtype, num_seqs) -> None:
    seqs = [(8192 - (997 * i) % 8000, 1) for i in range(num_seqs)]
    batch = _batch(seqs, 32, 8, 128, 16, dtype, seed=num_seqs)
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 128**-0.5)
    assert relative_error(out, _reference(batch, 128**-0.5)) < 1e-2


@pytest.mark.parametrize("contexts", [[130], [4096], [4096, 300, 5000]])
def test_a_decode_step_is_one_launch_whatever_the_splits_and_leaves_the_counters_zeroed(contexts) -> None:
    from pagoda_runtime.executor.kernels import triton_paged_attention

    batch = _batch([(c, 1) for c in contexts], 32, 8, 128, 16, torch.bfloat16, seed=len(contexts))
    paged_attention(batch.q, batch.kv_cache, batch.meta, 128**-0.5)  # compiled before profiling
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        out = paged_attention(batch.q, batch.kv_cache, batch.meta, 128**-0.5)
        torch.cuda.synchronize()
    launches = [e.name for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert launches == ["_paged_attention_kernel"]
    assert relative_error(out, _reference(batch, 128**-0.5)) < 1e-2
    assert not triton_paged_attention._ARRIVALS[torch.device("cuda", 0)][-1].any()


def test_the_kernels_are_compiled_not_interpreted() -> None:
    import triton.language as tl
    from pagoda_runtime.executor.kernels import triton_paged_attention
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    assert isinstance(triton_paged_attention._paged_attention_kernel, JITFunction)
    assert not isinstance(tl.standard.cdiv, InterpretedFunction)


def test_8k_float32_decode_splits_k_and_matches_float64() -> None:
    seqs = [(8192, 1), (8000, 1)]
    assert max_splits(len(seqs), 8, torch.device("cuda")) > 1
    batch = _batch(seqs, 32, 8, 128, 16, torch.float32, seed=8)
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 128**-0.5)
    # float32 dots in full precision ("ieee"), not TF32.
    assert relative_error(out, dense_attention(batch, 128**-0.5)) < 1e-5


def test_decode_replayed_from_a_cuda_graph_as_contexts_grow() -> None:
    batch = _batch([(100, 1), (37, 1), (2000, 1)], 32, 8, 128, 16, torch.bfloat16)
    scale = 128**-0.5
    true_lens = batch.meta.seq_lens.clone()
    batch.meta.seq_lens.copy_(torch.tensor([90, 30, 1000], dtype=torch.int32))
    paged_attention(batch.q, batch.kv_cache, batch.meta, scale)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention(batch.q, batch.kv_cache, batch.meta, scale)
    batch.meta.seq_lens.copy_(true_lens)
    graph.replay()
    assert relative_error(out, _reference(batch, scale)) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_and_kv_write_in_one_kernel(dtype) -> None:
    config = ModelConfig(
        architecture="llama",
        vocab_size=8,
        hidden_size=4096,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    cache = build_cos_sin_cache(config, 8192, "cuda", torch.float32)
    positions = torch.randint(0, 8192, (300,), device="cuda")
    qkv = torch.randn(300, 48 * 128, device="cuda", dtype=dtype)
    q, k = qkv[:, : 32 * 128].view(300, 32, 128), qkv[:, 32 * 128 : 40 * 128].view(300, 8, 128)
    v = qkv[:, 40 * 128 :].view(300, 8, 128)
    q_ref, k_ref = reference.rotary(positions, q.float(), k.float(), cache)
    kv_cache = torch.zeros(2, 40, 16, 8, 128, device="cuda", dtype=dtype)
    slots = torch.randperm(40 * 16, device="cuda")[:300]
    get_attention_ops("cuda").rotary_write_kv(positions, q, k, v, cache, kv_cache, slots)
    assert relative_error(q, q_ref) < 1e-2
    assert relative_error(kv_cache[0].flatten(0, 1)[slots], k_ref) < 1e-2
    assert torch.equal(kv_cache[1].flatten(0, 1)[slots], v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_silu_and_mul(dtype) -> None:
    x, residual = (
        torch.randn(64, 4096, device="cuda", dtype=dtype),
        torch.randn(64, 4096, device="cuda", dtype=dtype),
    )
    weight = torch.randn(4096, device="cuda", dtype=dtype)
    normed, summed = rms_norm(x, weight, 1e-5, residual)
    normed_ref, summed_ref = reference.rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(summed, summed_ref) and relative_error(normed, normed_ref) < 1e-2
    gate_up = torch.randn(64, 2 * 14336, device="cuda", dtype=dtype)
    assert relative_error(silu_and_mul(gate_up), reference.silu_and_mul(gate_up)) < 1e-2


def test_fp8_kv_write_rounds_like_torch() -> None:
    cache = torch.zeros(2, 40, 16, 8, 128, device="cuda").to(reference.FP8_KV_DTYPE)
    expected = cache.clone()
    kv = torch.randn(300, 16, 128, device="cuda") * torch.logspace(-5, 3, 128, device="cuda")
    kv = kv.to(torch.bfloat16)
    slots = torch.randperm(40 * 16, device="cuda")[:300]
    # Position 0 rotates by nothing: the write alone is checked.
    positions, q = torch.zeros(300, dtype=torch.long, device="cuda"), torch.zeros_like(kv[:, :8])
    cos_sin = torch.cat((torch.ones(1, 64), torch.zeros(1, 64)), dim=1).cuda()
    get_attention_ops("cuda").rotary_write_kv(positions, q, kv[:, :8], kv[:, 8:], cos_sin, cache, slots)
    reference.write_kv(kv[:, :8], kv[:, 8:], expected, slots)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_batch_over_an_fp8_cache(dtype) -> None:
    seqs = [(700, 1), (129, 1), (512, 512), (1500, 300), (3, 1)]
    fp8 = reference.FP8_KV_DTYPE
    batch = make_paged_batch(seqs, 32, 8, 128, 16, dtype=dtype, device="cuda", seed=5, kv_cache_dtype=fp8)
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 128**-0.5)
    expected = reference.attention(batch.q.float(), batch.kv_cache, batch.meta, 128**-0.5)
    assert out.dtype == dtype and relative_error(out, expected) < 1e-2
