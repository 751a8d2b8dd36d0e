"""How one projection holds the LoRA adapters a step may use: every slot's A and B stacked, so a
single kernel launch serves the tokens of many adapters.

For a projection whose output is the concatenation of `output_slices` parts (qkv_proj: q, k, v;
gate_up_proj: gate, up; the others one part):
- lora_a: [num_slices, S, R, H], slot s's A of each part (an adapter has its own A per part);
- lora_b: [S, sum(output_slices), R], slot s's B of every part stacked in output order;
- scaling: float32 [S], each adapter's lora_alpha / r (0 for an empty slot).
R is the largest rank a slot may hold; a smaller adapter fills its first r rows of A and columns of
B and zeros the rest, which adds exactly nothing. A part the adapter does not train (PEFT's
target_modules without k_proj, say) and an empty slot are zeros too.

Tensor parallelism shards the adapters like their base layer: A like the base's input (the
row-parallel o_proj and down_proj hold a slice of H), B like its output (the column-parallel
qkv_proj and gate_up_proj hold a slice of each part's rows). A row-parallel rank's LoRA output is
then a partial sum, added to its partial base output before the all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# slot -> one (A [r, H], B [out_i, r]) per output part, None for a part the adapter leaves alone;
# None for an empty slot.
Adapter = Sequence[tuple[torch.Tensor, torch.Tensor] | None] | None


def stack_lora_weights(
    adapters: Sequence[Adapter],
    in_features: int,
    output_slices: Sequence[int],
    max_rank: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """adapters, one per slot -> (lora_a [num_slices, S, max_rank, H], lora_b [S, sum(out), max_rank])."""
    num_slices, num_slots = len(output_slices), len(adapters)
    lora_a = torch.zeros(num_slices, num_slots, max_rank, in_features, dtype=dtype, device=device)
    lora_b = torch.zeros(num_slots, sum(output_slices), max_rank, dtype=dtype, device=device)
    for slot, adapter in enumerate(adapters):
        if adapter is None:
            continue
        if len(adapter) != num_slices:
            raise ValueError(
                f"the adapter in slot {slot} has {len(adapter)} parts; this projection has {num_slices}"
            )
        offset = 0
        for part, (weights, width) in enumerate(zip(adapter, output_slices, strict=True)):
            if weights is not None:
                a, b = weights
                rank = a.shape[0]
                if rank > max_rank or a.shape[1] != in_features or tuple(b.shape) != (width, rank):
                    raise ValueError(
                        f"the adapter in slot {slot} has A {tuple(a.shape)} and B {tuple(b.shape)} for part "
                        f"{part}; this projection takes A [r, {in_features}] and B [{width}, r], "
                        f"r <= {max_rank}"
                    )
                lora_a[part, slot, :rank] = a.to(dtype)
                lora_b[slot, offset : offset + width, :rank] = b.to(dtype)
            offset += width
    return lora_a, lora_b


def shard_lora(
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    output_slices: Sequence[int],
    input_part: slice | None = None,
    output_parts: Sequence[slice] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """One tensor-parallel rank's adapters: A's inputs `input_part` (a row-parallel base), and of each
    output part the rows `output_parts[i]` (a column-parallel base: the slices its weight keeps)."""
    if input_part is not None:
        lora_a = lora_a[..., input_part].contiguous()
    if output_parts is None:
        return lora_a, lora_b, tuple(output_slices)
    starts = [sum(output_slices[:i]) for i in range(len(output_slices))]
    rows = [
        torch.arange(start + p.start, start + p.stop) for start, p in zip(starts, output_parts, strict=True)
    ]
    lora_b = lora_b[:, torch.cat(rows).to(lora_b.device)].contiguous()
    return lora_a, lora_b, tuple(p.stop - p.start for p in output_parts)
