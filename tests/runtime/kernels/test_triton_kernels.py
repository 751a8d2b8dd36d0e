"""The Triton kernels compute what the PyTorch reference computes: compiled on a GPU, in Triton's
interpreter on a CPU-only machine (pagoda_runtime/executor/triton_mode.py decides)."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.executor.kernels import build_cos_sin_cache, reference, triton_paged_attention
from pagoda_runtime.executor.kernels.triton_paged_attention import paged_attention
from pagoda_runtime.executor.kernels.triton_rmsnorm import rms_norm
from pagoda_runtime.executor.kernels.triton_rotary_kv_write import rotary_write_kv
from pagoda_runtime.executor.kernels.triton_silu_mul import silu_and_mul

from .paged_batch import dense_attention, make_paged_batch, relative_error, release_outside_window

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIXED = [(37, 1), (20, 20), (50, 13), (1, 1), (16, 1), (70, 2)]


def _written(batch):
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    return batch


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
def test_paged_attention_on_mixed_batches(block_size: int, heads: int, kv_heads: int) -> None:
    batch = _written(make_paged_batch(MIXED, heads, kv_heads, 64, block_size, device=DEVICE, seed=block_size))
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.125)
    assert relative_error(out, reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125)) < 1e-5
    assert relative_error(out, dense_attention(batch, 0.125)) < 1e-5


@pytest.mark.parametrize("head_dim,block_size", [(128, 16), (80, 8), (8, 16)])
def test_paged_attention_head_dims(head_dim: int, block_size: int) -> None:
    batch = _written(make_paged_batch([(40, 1), (33, 17)], 8, 2, head_dim, block_size, device=DEVICE, seed=1))
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, head_dim**-0.5)
    assert relative_error(out, dense_attention(batch, head_dim**-0.5)) < 1e-5


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_k_decode_merges_in_the_last_split_to_the_same_result(num_splits: int) -> None:
    # With a split per 32 keys: 3 keys take one split and no merge, 64 take two, 150 and 129 take
    # as many as allowed; twice in a row, so the arrival counters must have been left at zero.
    seqs = [(150, 1), (3, 1), (64, 1), (129, 1)]
    batch = _written(make_paged_batch(seqs, 12, 4, 64, 16, device=DEVICE, seed=num_splits))
    for _ in range(2):
        out = paged_attention(
            batch.q, batch.kv_cache, batch.meta, 0.125, num_splits=num_splits, min_split_tokens=32
        )
        assert relative_error(out, dense_attention(batch, 0.125)) < 1e-5
    assert not triton_paged_attention._ARRIVALS[torch.device(DEVICE)][-1].any()


@pytest.mark.parametrize("num_splits", [None, 3])
def test_a_sliding_window_never_reads_the_blocks_behind_it_and_soft_caps_the_scores(num_splits) -> None:
    # Decode rows and prefill chunks whose windows start mid-block, ahead of released blocks.
    seqs = [(70, 1), (45, 13), (9, 1), (90, 30), (20, 20)]
    batch = _written(make_paged_batch(seqs, 8, 2, 64, 8, device=DEVICE, seed=11))
    release_outside_window(batch, 21)
    expected = dense_attention(batch, 0.125, window=21, softcap=2.0)
    out = paged_attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, window=21, softcap=2.0, num_splits=num_splits
    )
    assert relative_error(out, expected) < 1e-5
    ref = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, window=21, softcap=2.0)
    assert relative_error(ref, expected) < 1e-5


@pytest.mark.parametrize("num_splits", [None, 3])
def test_chunked_attention_sees_only_the_query_s_own_chunk(num_splits) -> None:
    # Llama 4's chunked layers: chunks of 16 keys; decode rows at a chunk's first and last position,
    # prefill chunks that cross one or several chunk boundaries, and one that starts on a boundary.
    seqs = [(70, 1), (65, 1), (64, 1), (45, 13), (90, 40), (20, 20), (48, 16)]
    batch = _written(make_paged_batch(seqs, 8, 2, 64, 8, device=DEVICE, seed=12))
    release_outside_window(batch, 16, chunked=True)
    expected = dense_attention(batch, 0.125, chunk=16)
    out = paged_attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, window=16, chunked=True, num_splits=num_splits
    )
    assert relative_error(out, expected) < 1e-5
    ref = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, window=16, chunked=True)
    assert relative_error(ref, expected) < 1e-5
    # The chunk is not a sliding window of the same size: most rows differ.
    assert relative_error(ref, dense_attention(batch, 0.125, window=16)) > 0.1


def test_verify_steps_split_their_contexts_as_decode_does(monkeypatch) -> None:
    # Speculative decoding's verify step: 1 + K queries per sequence over long contexts. The kernel
    # takes decode's small tiles and its splits for them (as on a GPU, where max_splits is above 1).
    monkeypatch.setattr(triton_paged_attention, "max_splits", lambda *args: 4)
    launched = []
    kernel = triton_paged_attention._paged_attention_kernel
    monkeypatch.setattr(
        triton_paged_attention,
        "_paged_attention_kernel",
        _Recording(kernel, launched),
    )
    batch = _written(make_paged_batch([(150, 5), (40, 3), (129, 5)], 8, 2, 64, 16, device=DEVICE, seed=3))
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.125, min_split_tokens=32)
    assert relative_error(out, dense_attention(batch, 0.125)) < 1e-5
    assert launched == [{"BLOCK_Q": 32, "NUM_SPLITS": 4}]


class _Recording:
    """The kernel, launched as it is, recording each launch's tile and split count."""

    def __init__(self, kernel, launched: list) -> None:
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launched.append({"BLOCK_Q": kwargs["BLOCK_Q"], "NUM_SPLITS": kwargs["NUM_SPLITS"]})
            return self.kernel[grid](*args, **kwargs)

        return launch


def test_split_k_over_prefill_chunks() -> None:
    batch = _written(make_paged_batch([(90, 30), (12, 1)], 6, 3, 64, 8, device=DEVICE, seed=7))
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.125, num_splits=3, min_split_tokens=16)
    assert relative_error(out, dense_attention(batch, 0.125)) < 1e-5


def test_kv_scales_multiply_the_stored_keys_and_values() -> None:
    batch = make_paged_batch([(40, 1), (70, 3)], 8, 2, 64, 16, device=DEVICE, seed=4)
    scales = torch.tensor([[0.5, 2.0], [4.0, 0.25]], device=DEVICE)
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    plain = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.125)
    # The cache divided by the scales, read with them, is the cache.
    divided = batch.kv_cache.clone()
    divided /= scales[:, None, None, :, None]
    scaled = paged_attention(batch.q, divided, batch.meta, 0.125, kv_scales=scales)
    assert relative_error(scaled, plain) < 1e-5


def test_paged_attention_reads_queries_from_a_fused_qkv_view() -> None:
    batch = _written(make_paged_batch(MIXED, 8, 2, 64, 16, device=DEVICE, seed=2))
    qkv = torch.randn(batch.q.shape[0], 12 * 64, device=DEVICE)
    q = qkv[:, : 8 * 64].view(-1, 8, 64)
    q.copy_(batch.q)
    out = paged_attention(q, batch.kv_cache, batch.meta, 0.125)
    assert relative_error(out, dense_attention(batch, 0.125)) < 1e-5


def _cos_sin_cache(head_dim: int) -> torch.Tensor:
    architecture = ModelArchitecture(
        vocab_size=8,
        hidden_size=9 * head_dim,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=head_dim,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    config = ModelConfig("llama", architecture, rms_norm_eps=1e-5, rope_theta=100000.0)
    return build_cos_sin_cache(config, 2048, DEVICE, torch.float32)


@pytest.mark.parametrize("kv_heads,head_dim,block_size", [(3, 64, 8), (8, 128, 32), (2, 80, 16)])
def test_rotary_kv_write_matches_reference_and_skips_padding(
    kv_heads: int, head_dim: int, block_size: int
) -> None:
    cos_sin = _cos_sin_cache(head_dim)
    positions = torch.tensor([0, 1, 2, 1000, 2047], device=DEVICE)
    # q, k and v as views of one projection output, as the model passes them.
    qkv = torch.randn(5, (9 + 2 * kv_heads) * head_dim, device=DEVICE)
    q = qkv[:, : 9 * head_dim].view(5, 9, head_dim)
    k = qkv[:, 9 * head_dim : (9 + kv_heads) * head_dim].view(5, kv_heads, head_dim)
    v = qkv[:, (9 + kv_heads) * head_dim :].view(5, kv_heads, head_dim)
    k_before = k.clone()
    cache = torch.randn(2, 6, block_size, kv_heads, head_dim, device=DEVICE)
    expected_cache, expected_q = cache.clone(), q.clone()
    slots = torch.tensor([3, -1, 6 * block_size - 1, block_size, 0], device=DEVICE)
    reference.rotary_write_kv(positions, expected_q, k.clone(), v, cos_sin, expected_cache, slots)
    out = rotary_write_kv(positions, q, k, v, cos_sin, cache, slots)
    assert out.data_ptr() == qkv.data_ptr()  # rotated in place
    assert torch.allclose(q, expected_q, atol=1e-5) and torch.allclose(cache, expected_cache, atol=1e-5)
    untouched = torch.ones(2, 6 * block_size, dtype=torch.bool, device=DEVICE)
    untouched[:, slots[slots >= 0]] = False
    assert torch.equal(cache.flatten(1, 2)[untouched], expected_cache.flatten(1, 2)[untouched])
    assert torch.equal(k, k_before)  # the rotated key goes to the cache only


@pytest.mark.parametrize("scaled", [False, True])
def test_fp8_kv_write_matches_reference_bit_for_bit_and_saturates(scaled: bool) -> None:
    cache = torch.zeros(2, 6, 8, 3, 64, device=DEVICE).to(reference.FP8_KV_DTYPE)
    # Per kv head: keys and values divided by these on the way in.
    kv_scales = torch.tensor([[1.5, 0.25, 3.0], [0.1, 2.0, 1.0]], device=DEVICE) if scaled else None
    expected = cache.clone()
    # Magnitudes from e4m3's subnormals (below 2^-6) to past its largest value, 448.
    kv = torch.randn(5, 6, 64, device=DEVICE) * torch.logspace(-5, 3, 64, device=DEVICE)
    k, v = kv[:, :3], kv[:, 3:]
    q = torch.zeros(5, 3, 64, device=DEVICE)
    slots = torch.tensor([3, -1, 47, 8, 0], device=DEVICE)
    # Position 0 rotates by nothing (cos 1, sin 0), exactly: what is checked is the write alone.
    positions = torch.zeros(5, dtype=torch.long, device=DEVICE)
    rotary_write_kv(positions, q, k, v, _cos_sin_cache(64), cache, slots, kv_scales=kv_scales)
    reference.write_kv(k, v, expected, slots, kv_scales=kv_scales)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
    stored_k = cache[0].flatten(0, 1)[slots[slots >= 0]].float()
    assert not stored_k.isnan().any() and stored_k.abs().max() == 448  # saturated, not NaN
    step = 2**-9  # e4m3's subnormal step, times the largest key scale
    if scaled:
        stored_k, step = stored_k * kv_scales[0][:, None], step * 3.0
    small = k[slots >= 0].abs() < 0.1
    assert torch.allclose(stored_k[small], k[slots >= 0][small], rtol=0.07, atol=step)


@pytest.mark.parametrize(
    "dtype,scaled", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)]
)
def test_paged_attention_over_an_fp8_cache_matches_reference(dtype: torch.dtype, scaled: bool) -> None:
    fp8 = reference.FP8_KV_DTYPE
    batch = make_paged_batch(MIXED, 8, 2, 64, 16, dtype=dtype, device=DEVICE, seed=3, kv_cache_dtype=fp8)
    # The prefixes are stored unscaled: with scales both sides read them scaled, alike.
    scales = torch.tensor([[0.02, 0.5], [0.01, 0.03]], device=DEVICE) if scaled else None
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping, kv_scales=scales)
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.125, kv_scales=scales)
    expected = reference.attention(batch.q.float(), batch.kv_cache, batch.meta, 0.125, kv_scales=scales)
    assert relative_error(out, expected) < (1e-5 if dtype == torch.float32 else 1e-2)
    if not scaled:
        # e4m3 keeps 3 mantissa bits: a relative step of at most 1/16 per key and value.
        assert relative_error(out, dense_attention(batch, 0.125)) < 0.05


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(with_residual: bool) -> None:
    x, weight = torch.randn(5, 576, device=DEVICE), torch.randn(576, device=DEVICE)
    residual = torch.randn(5, 576, device=DEVICE) if with_residual else None
    normed, summed = rms_norm(x, weight, 1e-5, residual)
    normed_ref, summed_ref = reference.rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(summed, summed_ref)
    assert torch.allclose(normed, normed_ref, atol=1e-5, rtol=1e-5)


def test_silu_and_mul_matches_reference() -> None:
    gate_up = torch.randn(4, 2 * 1536, device=DEVICE) * 4
    assert torch.allclose(silu_and_mul(gate_up), reference.silu_and_mul(gate_up), atol=1e-5, rtol=1e-5)
