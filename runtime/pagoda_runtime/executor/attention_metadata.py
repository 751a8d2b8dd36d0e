"""What one forward step tells the attention kernels about the batch.

The batch is "flat": the new tokens of every scheduled sequence are concatenated, decode
sequences contributing one token and prefill chunks several. Sequence i owns query rows
query_start_loc[i]:query_start_loc[i+1]; its keys are the first seq_lens[i] slots named by
block_tables[i] (cached prefix plus the tokens of this step, which are written to the cache
before attention runs). Query j of sequence i sits at position seq_lens[i] - query_len_i + j
and attends causally to keys at positions <= its own (and, in a sliding-window layer, within
the window).

A model whose sliding-window layers keep their KV in a pool of their own (model_runner.py) has a
second table and slot mapping for those layers; `for_window` gives a layer the metadata it reads.
A hybrid model's recurrent layers read each sequence's state slot and whether its
state starts this step (models/recurrent_state.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [num_tokens]: block_id * block_size + offset of each new token
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]: context length after this step
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with 0
    max_query_len: int
    max_seq_len: int
    # Tensors derived from the fields above that every layer of the step would otherwise rebuild
    # (the CPU attention's gather indices and masks), computed by the first layer.
    derived: dict = field(default_factory=dict, repr=False, compare=False)
    # The sliding-window layers' own pool: their tables (entries behind the window name no block)
    # and the slots of this step's tokens there; None where those layers share the tables above.
    window_block_tables: torch.Tensor | None = None
    window_slot_mapping: torch.Tensor | None = None
    # A hybrid model's: each sequence's recurrent state slot, int64 [num_seqs] (padding sequences a spare
    # slot), and whether this step computes its first token (its state starts from zeros), bool.
    state_slots: torch.Tensor | None = None
    state_fresh: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def for_window(self, window: int | None) -> AttentionMetadata:
        """The metadata a layer with this sliding window (None: full attention) reads."""
        if window is None or self.window_block_tables is None:
            return self
        if "window_pool" not in self.derived:
            self.derived["window_pool"] = replace(
                self,
                slot_mapping=self.window_slot_mapping,
                block_tables=self.window_block_tables,
                derived={},
                window_block_tables=None,
                window_slot_mapping=None,
            )
        return self.derived["window_pool"]
