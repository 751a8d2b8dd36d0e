"""The embedding and the LM head split by vocabulary rows over the tensor-parallel ranks.

The vocabulary is padded to a multiple of the group size (sizing.padded_vocab_size) and each rank
holds one contiguous slice of rows. A lookup zeroes the tokens outside the slice and sums over the
ranks; the logits of each slice are gathered and cut back to the real vocabulary, so a padding row
is never sampled. One process holds every row and takes neither detour.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda_runtime.contract.sizing import padded_vocab_size
from pagoda_runtime.parallel.tensor_parallel import TensorParallel


class VocabParallel(nn.Module):
    """A [vocab, hidden] matrix split by rows: the token embedding, or the LM head (or both, tied)."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp: TensorParallel, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.dtype = dtype  # of the activations: lookups come out in it, whatever the matrix is held in
        self.rows = tp.part(padded_vocab_size(vocab_size, tp.size), "vocabulary rows")
        shape = (self.rows.stop - self.rows.start, hidden_size)
        # Uninitialized: the checkpoint fills it (see CausalLM.load_weights).
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)

    def load(self, weight: torch.Tensor) -> None:
        """Take this rank's rows of the checkpoint's whole [vocab, hidden] matrix."""
        if tuple(weight.shape) != (self.vocab_size, self.weight.shape[1]):
            raise ValueError(
                f"a vocabulary matrix of shape {list(weight.shape)} does not fit this model's "
                f"{self.vocab_size}x{self.weight.shape[1]}; the checkpoint does not match its config"
            )
        real = weight[self.rows.start : min(self.rows.stop, self.vocab_size)]
        self.weight.data.zero_()
        self.weight.data[: real.shape[0]] = real.to(self.weight.dtype)

    def hold_in(self, dtype: torch.dtype) -> None:
        """Keep the matrix in `dtype` from now on; lookups and logits keep their dtypes. On the CPU
        the LM head reads the whole matrix every step, and bfloat16 halves that."""
        self.weight.data = self.weight.data.to(dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of input_ids, whole on every rank."""
        if self.tp.size == 1:
            return nn.functional.embedding(input_ids, self.weight).to(self.dtype)
        local = input_ids - self.rows.start
        # Masked without a host sync (no boolean indexing), so a CUDA graph can hold it.
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = nn.functional.embedding(torch.where(mine, local, 0), self.weight).to(self.dtype)
        return self.tp.all_reduce(x * mine.unsqueeze(-1).to(x.dtype))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [tokens, vocab] of the whole vocabulary, on every rank."""
        local = nn.functional.linear(hidden.to(self.weight.dtype), self.weight).float()
        if self.tp.size == 1:
            return local
        return self.tp.all_gather(local, dim=-1)[..., : self.vocab_size]
