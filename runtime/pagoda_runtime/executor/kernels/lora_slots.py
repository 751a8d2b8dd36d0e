"""A step's tokens grouped by LoRA adapter slot: computed once per step and shared by every layer's
add_lora (kernels/lora.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

NO_ADAPTER = -1


@dataclass(frozen=True)
class LoraBatch:
    """A step's tokens grouped by adapter slot.

    token_slots [T] int32: each token's slot, NO_ADAPTER for the base model's tokens;
    sorted_tokens [T] int32: token indices slot by slot (in token order inside a slot), base last;
    slot_starts, slot_counts [S] int32: where each slot's tokens begin in sorted_tokens, how many.
    """

    token_slots: torch.Tensor
    sorted_tokens: torch.Tensor
    slot_starts: torch.Tensor
    slot_counts: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.token_slots.shape[0]

    @property
    def num_slots(self) -> int:
        return self.slot_counts.shape[0]


def lora_batch(token_slots: torch.Tensor, num_slots: int) -> LoraBatch:
    """token_slots [T] (a prefill's run of tokens and a decode token alike carry their request's
    slot) -> LoraBatch. Fixed shapes and no wait for the device: a decode step's graph captures it."""
    slots = token_slots.to(torch.int64)
    key = torch.where(slots < 0, num_slots, slots)
    counts = torch.zeros(num_slots + 1, dtype=torch.int64, device=slots.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_slots]
    return LoraBatch(
        token_slots=token_slots.to(torch.int32),
        sorted_tokens=torch.argsort(key, stable=True).to(torch.int32),
        slot_starts=(counts.cumsum(0) - counts).to(torch.int32),
        slot_counts=counts.to(torch.int32),
    )
