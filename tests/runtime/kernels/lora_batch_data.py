"""A mixed LoRA step for the tests: three adapters of different ranks, an empty slot and base-model
tokens, as prefill runs and single decode tokens, on a fused projection's output parts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pagoda_runtime.executor.kernels.lora_weights import stack_lora_weights

# Prefill runs of 9, 5 and 20 tokens, and decode tokens, of slots 0, 1, 3; -1: the base model.
MIXED_SLOTS = [0] * 9 + [-1] * 3 + [1] * 5 + [3, 0, -1, 1] + [3] * 20 + [-1, 0]


@dataclass(frozen=True)
class LoraCase:
    x: torch.Tensor
    base_out: torch.Tensor
    token_slots: torch.Tensor
    adapters: list  # per slot: None or one (A [r, H], B [out_i, r]) or None per part
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scaling: torch.Tensor
    output_slices: tuple[int, ...]


def make_lora_case(
    in_features: int,
    output_slices: tuple[int, ...],
    max_rank: int,
    dtype: torch.dtype = torch.float32,
    slots: list[int] = MIXED_SLOTS,
    device: str = "cpu",
    seed: int = 0,
) -> LoraCase:
    """Four slots: 0 of rank max_rank, 1 of half that, 2 empty, 3 of rank max_rank that leaves its
    second part alone (PEFT target_modules without k_proj, say). B is scaled so that the adapters'
    deltas are as large as the base output, which a wrong delta cannot hide in."""
    generator = torch.Generator().manual_seed(seed)
    ranks = [max_rank, max(1, max_rank // 2), None, max_rank]
    adapters = []
    for slot, rank in enumerate(ranks):
        if rank is None:
            adapters.append(None)
            continue
        parts = []
        for part, width in enumerate(output_slices):
            if slot == 3 and part == 1:
                parts.append(None)
                continue
            a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
            b = torch.randn(width, rank, generator=generator) / rank**0.5
            parts.append((a, b))
        adapters.append(parts)
    lora_a, lora_b = stack_lora_weights(adapters, in_features, output_slices, max_rank, dtype, device)
    num_tokens = len(slots)
    x = torch.randn(num_tokens, in_features, generator=generator).to(device, dtype)
    base_out = torch.randn(num_tokens, sum(output_slices), generator=generator).to(device, dtype)
    return LoraCase(
        x=x,
        base_out=base_out,
        token_slots=torch.tensor(slots, dtype=torch.int32, device=device),
        adapters=adapters,
        lora_a=lora_a,
        lora_b=lora_b,
        scaling=torch.tensor([2.0, 0.5, 1.0, 1.5], device=device),
        output_slices=output_slices,
    )


def peft_output(case: LoraCase) -> torch.Tensor:
    """base_out + scaling * B_i (A_i x) token by token from the unstacked adapters, in float64."""
    out = case.base_out.double().clone()
    for t, slot in enumerate(case.token_slots.tolist()):
        if slot < 0:
            continue
        offset = 0
        for part, width in enumerate(case.output_slices):
            weights = case.adapters[slot][part]
            if weights is not None:
                a, b = (w.to(case.x.device, case.x.dtype).double() for w in weights)
                out[t, offset : offset + width] += case.scaling[slot].item() * (b @ (a @ case.x[t].double()))
            offset += width
    return out
