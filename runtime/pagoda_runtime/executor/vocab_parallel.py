"""The embedding and the LM head split by vocabulary rows over the tensor-parallel ranks.

The vocabulary is padded to a multiple of the group size (sizing.padded_vocab_size) and each rank
holds one contiguous slice of rows. A lookup zeroes the tokens outside the slice and sums over the
ranks; the logits of each slice are gathered and cut back to the real vocabulary, so a padding row
is never sampled. One process holds every row and takes neither detour.

The logits come out in float32 on every path, accumulated in float32 from the matrix's own dtype:
rounding them to 16 bits turns a near tie between the model's top two tokens into an exact one
(SmolLM2's 0.08-nat lead of "The" over "L" for the capital of France), and changes greedy answers.
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
        # On the CPU's 16-bit path: the LM head packed for fbgemm's float16 GEMM (hold_in).
        self._packed_head: torch.ScriptObject | None = None
        self.head_bytes = 0  # bytes of that packed copy, beside the weight's

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

    def hold_in(self, dtype: torch.dtype, *, lookups: bool, logits: bool) -> None:
        """On the CPU: keep the matrix in the 16-bit `dtype` from now on, for the `lookups` (the
        embedding) and the `logits` (the LM head) this module serves; lookups and logits keep their
        dtypes. The LM head reads the whole matrix every step, and 16 bits halve that. Its logits
        go through fbgemm's float16 GEMM, which takes float32 activations and accumulates and
        returns float32, from a packed copy of the matrix (a tied embedding keeps its own copy for
        lookups); without fbgemm the matrix is widened to float32 at each step instead."""
        weight = self.weight.data
        if logits and dtype == torch.float16 and "fbgemm" in torch.backends.quantized.supported_engines:
            self._packed_head = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
            self.head_bytes = weight.numel() * 2
        keep = lookups or self._packed_head is None
        self.weight.data = weight.to(dtype) if keep else weight.new_empty((0, weight.shape[1]), dtype=dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of input_ids, whole on every rank."""
        if self.tp.size == 1:
            return nn.functional.embedding(input_ids, self.weight).to(self.dtype)
        local = input_ids - self.rows.start
        # Masked without a host sync (no boolean indexing), so a CUDA graph can hold it.
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = nn.functional.embedding(torch.where(mine, local, 0), self.weight).to(self.dtype)
        return self.tp.all_reduce(x * mine.unsqueeze(-1).to(x.dtype))

    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits [tokens, vocab] of the whole vocabulary, on every rank; into `out` when
        given (a CUDA graph's output buffer)."""
        weight = self.weight
        if self._packed_head is not None:
            local = torch.ops.quantized.linear_dynamic_fp16(hidden.float(), self._packed_head)
        elif weight.dtype == torch.float32:
            local = nn.functional.linear(hidden.float(), weight)
        elif weight.is_cuda:
            # 16-bit inputs, float32 accumulation and output: cuBLAS in one call.
            local = torch.mm(hidden.to(weight.dtype), weight.t(), out_dtype=torch.float32)
        else:
            local = nn.functional.linear(hidden.float(), weight.float())
        if self.tp.size > 1:
            local = self.tp.all_gather(local, dim=-1)[..., : self.vocab_size]
        return local if out is None else out.copy_(local)
