"""The PyTorch reference of batched LoRA: what runs on the CPU, and what the Triton shrink and expand
kernels are tested against. A loop over the slots present in the batch, in float32.

The shrink's float32 result is rounded to the activation dtype before the expand, as PEFT's
lora_B(lora_A(x)) rounds it between its two linear layers in a bf16 model; the delta is added to
the base output in float32 and rounded once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def reference_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, token_slots: torch.Tensor, scaling: torch.Tensor
) -> torch.Tensor:
    """x [T, H], lora_a [slices, S, R, H] -> scaling[s] * x @ A[s]^T per part: [1, slices, T, R] float32
    (one partial sum; the base model's tokens get zeros)."""
    num_slices, _, rank, _ = lora_a.shape
    y = torch.zeros(1, num_slices, x.shape[0], rank, dtype=torch.float32, device=x.device)
    for slot in torch.unique(token_slots[token_slots >= 0]).tolist():
        tokens = torch.where(token_slots == slot)[0]
        y[0, :, tokens] = scaling[slot].float() * (
            x[tokens].float() @ lora_a[:, slot].float().transpose(1, 2)
        )
    return y


def reference_expand(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    token_slots: torch.Tensor,
    base_out: torch.Tensor,
    output_slices: Sequence[int],
) -> torch.Tensor:
    """base_out[t, part i] += y[:, i, t] summed @ B_i[s]^T for the tokens with a slot, in place."""
    shrunk = y.sum(dim=0).to(base_out.dtype).float()
    for slot in torch.unique(token_slots[token_slots >= 0]).tolist():
        tokens = torch.where(token_slots == slot)[0]
        offset = 0
        for part, width in enumerate(output_slices):
            columns = slice(offset, offset + width)
            delta = shrunk[part, tokens] @ lora_b[slot, columns].float().t()
            base_out[tokens, columns] = (base_out[tokens, columns].float() + delta).to(base_out.dtype)
            offset += width
    return base_out


def reference_add_lora(
    base_out: torch.Tensor,
    x: torch.Tensor,
    token_slots: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: torch.Tensor,
    output_slices: Sequence[int],
) -> torch.Tensor:
    y = reference_shrink(x, lora_a, token_slots, scaling)
    return reference_expand(y, lora_b, token_slots, base_out, output_slices)
