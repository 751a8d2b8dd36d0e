"""Scales for an fp8 (e4m3) KV cache, one per layer, kv head and keys / values, calibrated at load.

e4m3 keeps 3 mantissa bits between 2^-6 and 448 and fewer below: with a scale of 1.0 a head whose
values are all small (values of 0.01 to 0.1 are common) stores them as subnormals, with one or two
significant bits. Dividing each head's keys and values by amax * HEADROOM / 448 puts its largest
value at 448 / HEADROOM, and every value down to about 2^-14 of it keeps e4m3's full relative
precision.

The amax comes from one prefill of calibration tokens through the model with a float cache of
the model's dtype: the keys as stored (rotated) and the values, per layer and kv head. The tokens
are random ids drawn with a fixed seed, so the scales depend on the weights only, and every rank
of a tensor-parallel group, each with its own heads, draws the same ones. HEADROOM leaves room for
texts whose values run larger than the calibration's; beyond it they saturate at +-448.
"""

from __future__ import annotations

import math

import torch

from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels.reference import FP8_MAX

CALIBRATION_TOKENS = 512
HEADROOM = 2.0
SEED = 0
# A head whose calibration values are all zero (a pruned head) keeps a scale of 1.
_MIN_AMAX = 1e-6


@torch.inference_mode()
def calibrate(
    model,
    vocab_size: int,
    max_model_len: int,
    block_size: int,
    planes: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """Per decoder layer of `model` (a LlamaForCausalLM), float32 [2, Hkv] scales: what its keys
    and values are to be divided by in an fp8 cache of `planes` planes (one: the values are the
    keys' plane, and both scales are its). The calibration prompt is CALIBRATION_TOKENS
    long, or the model's context if that is shorter (its rotary table ends there)."""
    tokens = min(CALIBRATION_TOKENS, max_model_len)
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, vocab_size, (tokens,), generator=generator).to(device)
    blocks = math.ceil(tokens / block_size)
    caches = [
        torch.zeros(planes, blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        for _ in model.layers
    ]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(tokens, device=device),
        query_start_loc=torch.tensor([0, tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([tokens], dtype=torch.int32, device=device),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device)[None],
        max_query_len=tokens,
        max_seq_len=tokens,
    )
    model(input_ids, torch.arange(tokens, device=device), caches, meta)
    scales = []
    for cache in caches:
        stored = cache[[0, -1]].flatten(1, 2)[:, :tokens].float()  # keys, values: [2, tokens, Hkv, D]
        amax = stored.abs().amax(dim=(1, 3)).clamp_min(_MIN_AMAX)
        scales.append(torch.where(amax > _MIN_AMAX, amax * HEADROOM / FP8_MAX, 1.0))
    return scales
