"""The block manager of a hybrid model, whose recurrent layers (Mamba-2, gated DeltaNet, short
convolutions) keep one state per sequence beside the attention layers' KV blocks
(executor/models/recurrent_state.py).

A sequence takes a state slot with its first blocks and gives it back with them, so a preempted
sequence recomputes from a fresh state as it recomputes its KV. A state holds the whole past of one
sequence and cannot be shared or cut back to a shorter prefix: prefix caching is off, and a sample
of a request with n > 1 computes its prompt itself instead of forking its leader's blocks.
"""

from __future__ import annotations

from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sequence import Sequence


class StateBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int, num_slots: int) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
        self._free_slots = list(range(num_slots - 1, -1, -1))

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return (seq.state_slot >= 0 or bool(self._free_slots)) and super().can_append(seq, num_new_tokens)

    def can_admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> bool:
        return bool(self._free_slots) and super().can_admit(seq, prefix, num_new_tokens)

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        if seq.state_slot < 0:
            seq.state_slot = self._free_slots.pop()
        super().append(seq, num_new_tokens)

    def forkable_blocks(self, parent: Sequence, num_blocks: int) -> int:
        return 0

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        if seq.state_slot >= 0:
            self._free_slots.append(seq.state_slot)
            seq.state_slot = -1
