"""PyTorch reference for every kernel: what runs on the CPU, and what the Triton kernels must match.

Everything is computed in float32 with the formulation Hugging Face transformers' eager Llama uses
(matmul, scale, mask, float32 softmax, matmul), so a float32 model reproduces its greedy tokens.

The KV cache holds k and v in its own dtype: the model's dtype, or fp8 e4m3 (float8_e4m3fn), where
values beyond +-448 saturate instead of becoming NaN. An fp8 cache may have scales, float32
[2, Hkv] per layer (keys, values; one per kv head, see executor/kv_scales.py): stored values are
k * (1 / scale), read back as stored * scale. Without them the scale is 1.0.

Attention sinks (GPT-OSS) are one more softmax column per query head, concatenated and dropped as
transformers' eager GPT-OSS attention does it, for the same reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda_runtime.executor.attention_metadata import AttentionMetadata

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_KV_DTYPE).max


def _per_step(derived: dict | None, key: str, build):
    """build(), kept in the step's memo (AttentionMetadata.derived) when one is given: every layer
    of a step rotates the same positions and writes the same slots, so the first layer builds what
    depends only on them."""
    if derived is None:
        return build()
    if key not in derived:
        derived[key] = build()
    return derived[key]


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin [T, 1, D] of the positions, so that rotate_half(x) * sin is
    flip_halves(x) * sin."""
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache[positions].float()
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    # Negation is exact, so x1 * cos + x2 * (-sin) equals the reference's x1 * cos - x2 * sin.
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    derived: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] in place, rotate_half style; returns (q, k)."""
    # Keyed by the table too: Gemma 3's local and global layers rotate with tables of their own.
    key = f"rotary_cos_sin/{cos_sin_cache.data_ptr()}"
    cos, sin = _per_step(derived, key, lambda: _cos_sin(positions, cos_sin_cache))
    half = q.shape[-1] // 2
    for x in (q, k):
        xf = x.float()  # x itself when it is float32, then rotated in place
        swapped = xf.unflatten(-1, (2, half)).flip(-2).flatten(-2)
        xf.mul_(cos).add_(swapped.mul_(sin))
        if xf is not x:
            x.copy_(xf)
    return q, k


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, Hkv, D] in the cache's dtype, through float32 as the Triton kernel does: multiplied
    by 1 / scale (one per kv head) first when one is given, saturated when the cache is fp8."""
    x = x.float()
    if scale is not None:
        x = x * (1 / scale)[:, None]
    if dtype == FP8_KV_DTYPE:
        x = x.clamp(-FP8_MAX, FP8_MAX)
    return x.to(dtype)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor | None,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    derived: dict | None = None,
    kv_scales: torch.Tensor | None = None,
) -> None:
    """Store k, v [T, Hkv, D] at their slots of kv_cache [2, blocks, block_size, Hkv, D], divided
    by kv_scales [2, Hkv] when given; v None: a one-plane cache [1, ...] whose keys are read as
    the values too (latent attention), k alone stored.

    A negative slot marks a padding token (a CUDA-graph batch padded to its bucket) and is skipped.
    """
    keep, slots = _per_step(derived, "write_kv_slots", lambda: _kept_slots(slot_mapping))
    if keep is not None:
        k = k[keep]
    k_scale, v_scale = (None, None) if kv_scales is None else kv_scales
    kv_cache[0].flatten(0, 1).index_put_((slots,), to_cache_dtype(k, kv_cache.dtype, k_scale))
    if v is not None:
        v = v if keep is None else v[keep]
        kv_cache[1].flatten(0, 1).index_put_((slots,), to_cache_dtype(v, kv_cache.dtype, v_scale))


def rotary_write_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    derived: dict | None = None,
    kv_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """rotary, then write_kv: q rotated in place, the rotated k and v in the cache; returns q."""
    q, k = rotary(positions, q, k, cos_sin_cache, derived)
    write_kv(k, v, kv_cache, slot_mapping, derived, kv_scales)
    return q


def _kept_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the mask of real tokens, or None when all are, and their slots)."""
    keep = slot_mapping >= 0
    if bool(keep.all()):
        return None, slot_mapping
    return keep, slot_mapping[keep]


def _slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of key `positions` [S, L] of each row of block_table [S, W]."""
    pages = torch.gather(block_table, 1, positions // block_size).long()
    return pages * block_size + positions % block_size


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [.., Hkv, G*M, D], k/v [.., Hkv, L, D], mask broadcastable to the scores (True = attend),
    or None where every key is attended; softcap: scores = softcap * tanh(scores / softcap);
    sink: each score row's sink logit, broadcastable to [.., Hkv, G*M, 1], or None."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sink is None:
        return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32), v)
    # The sink is a key without a value: it takes its share of the softmax and adds nothing.
    scores = torch.cat((scores, sink.expand(*scores.shape[:-1], 1)), dim=-1)
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32)[..., :-1], v)


def _gathered(cache: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The cache rows at `slots` [..., Hkv, D] in float32, times their kv head's scale if any."""
    values = cache[slots]
    values = values if values.dtype == torch.float32 else values.float()
    return values if scale is None else values * scale[:, None]


def _plan(meta: AttentionMetadata, block_size: int, window: int | None, chunked: bool) -> tuple:
    """The gather slots and masks of a step: (decode rows, their slots, their mask) and for each
    prefill chunk (start, end, slots, mask). The same for every layer of a window, so built once per
    step and window."""
    return _per_step(
        meta.derived,
        f"attention_plan/{window}/{chunked}",
        lambda: _build_plan(meta, block_size, window, chunked),
    )


def _first_keys(positions: torch.Tensor, window: int | None, chunked: bool) -> torch.Tensor:
    """The first key each query position sees: 0, the start of its window, or of its chunk."""
    if window is None:
        return torch.zeros_like(positions)
    if chunked:
        return positions - positions % window
    return (positions - window + 1).clamp(min=0)


def _build_plan(meta: AttentionMetadata, block_size: int, window: int | None, chunked: bool) -> tuple:
    """With a window, only the keys some query of the row still sees are gathered: a block wholly
    before the window is never read (its table entry may no longer name a block)."""
    device = meta.query_start_loc.device
    starts = meta.query_start_loc.tolist()
    query_lens = meta.query_start_loc.diff()
    decode = None
    rows = torch.nonzero(query_lens == 1).flatten()
    if rows.numel():
        lens = meta.seq_lens[rows].long()
        first = _first_keys(lens - 1, window, chunked)
        width = int((lens - first).max())
        positions = first[:, None] + torch.arange(width, device=device)[None, :]
        mask = positions < lens[:, None]
        # Padding positions read a real key of their own sequence: the rest of the cache may hold
        # NaN garbage, and a zero probability times NaN is still NaN.
        positions = torch.where(mask, positions, first[:, None])
        slots = _slots(meta.block_tables[rows], positions, block_size)
        # Ops saved in every layer: a step of decode rows only needs no gather and scatter of its
        # rows, and one whose rows have one context length (batch 1 always) no mask.
        all_rows = rows.numel() == meta.query_start_loc.shape[0] - 1 == int(meta.query_start_loc[-1])
        decode = (
            None if all_rows else meta.query_start_loc[rows].long(),
            slots,
            None if bool(mask.all()) else mask[:, None, None, :],
        )
    prefills = []
    for i in torch.nonzero(query_lens > 1).flatten().tolist():
        start, end = starts[i], starts[i + 1]
        context_len = int(meta.seq_lens[i])
        first_query = context_len - (end - start)
        query_pos = torch.arange(first_query, context_len, device=device)
        first_keys = _first_keys(query_pos, window, chunked)
        key_pos = torch.arange(int(first_keys[0]), context_len, device=device)
        slots = _slots(meta.block_tables[i : i + 1], key_pos[None, :], block_size)[0]
        causal = (key_pos[None, :] <= query_pos[:, None]) & (key_pos[None, :] >= first_keys[:, None])
        prefills.append((start, end, slots, causal))
    return decode, prefills


def attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_scales: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunked: bool = False,
) -> torch.Tensor:
    """Causal attention of q [T, H, D] over the paged cache (keys kv_cache[0], values kv_cache[-1]:
    a one-plane cache's keys are its values too); returns [T, H, D] in q's dtype.
    kv_scales [2, Hkv]: what the stored keys and values were divided by, or None.

    window: each query sees only the `window` keys up to its own position (a sliding-window layer);
    chunked: the window is an attention chunk instead, a query at p seeing the keys from
    p - p % window to p (Llama 4's chunked layers);
    softcap: the scores are soft-capped by tanh before the mask (Gemma 2); sinks: [H] (float), a
    logit per query head (natural log, unscaled, neither capped nor masked) that joins every row's
    softmax as a key whose value is zero (GPT-OSS), or None.

    Decode rows of the batch are done together (one gather, one padded batch); each prefill chunk
    is done alone, since padding chunks of different lengths to one shape wastes more than it saves.
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    key_cache = kv_cache[0].flatten(0, 1)
    value_cache = kv_cache[-1].flatten(0, 1)
    decode, prefills = _plan(meta, block_size, window, chunked)
    k_scale, v_scale = (None, None) if kv_scales is None else kv_scales
    sink = None if sinks is None else sinks.float().view(num_kv_heads, group, 1)
    out = torch.empty_like(q)

    if decode is not None:
        rows, slots, mask = decode
        k = _gathered(key_cache, slots, k_scale).permute(0, 2, 1, 3)  # [S, Hkv, L, D]
        v = _gathered(value_cache, slots, v_scale).permute(0, 2, 1, 3)
        qd = (q if rows is None else q[rows]).float().view(-1, num_kv_heads, group, head_dim)
        o = _attend(qd, k, v, mask, scale, softcap, sink).reshape(-1, num_heads, head_dim).to(q.dtype)
        if rows is None:
            return o
        out[rows] = o

    for start, end, slots, causal in prefills:
        query_len = end - start
        k = _gathered(key_cache, slots, k_scale).transpose(0, 1)  # [Hkv, L, D]
        v = _gathered(value_cache, slots, v_scale).transpose(0, 1)
        # [M, H, D] -> [Hkv, G*M, D], rows ordered (head in group, token).
        qp = q[start:end].float().view(query_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        qp = qp.reshape(num_kv_heads, group * query_len, head_dim)
        row_sink = None if sink is None else sink.repeat_interleave(query_len, dim=1)
        o = _attend(qp, k, v, causal.repeat(group, 1), scale, softcap, row_sink)
        o = o.view(num_kv_heads, group, query_len, head_dim)
        out[start:end] = o.permute(2, 0, 1, 3).reshape(query_len, num_heads, head_dim).to(q.dtype)
    return out


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual), the sum in x's dtype as transformers adds it."""
    if residual is not None:
        x = x + residual
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # One op instead of six; for float32 it computes x * rsqrt(mean(x^2) + eps) * weight with
        # the same roundings as the formulation below.
        return F.rms_norm(x, weight.shape, weight, eps), x
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype), x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [T, 2 * I] holding gate in the first half."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GELU(gate) * up, GELU tanh-approximated (Gemma's GeGLU), for gate_up as silu_and_mul's."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh").mul_(up)
