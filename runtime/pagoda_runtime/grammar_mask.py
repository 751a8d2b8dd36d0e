"""Constrained sampling on the device: one llguidance matcher per constrained sample, and each
step one bitmask for the whole batch, copied in one transfer and applied with one masked_fill.

The matchers compute their masks on the host (in parallel, without the GIL) while the device
still runs the forward pass; there is no per-sequence host/device synchronisation, and a batch
with no constrained sequence skips all of this.
"""

from __future__ import annotations

from functools import cached_property

import llguidance
import llguidance.torch
import torch

from pagoda_runtime.sequence import Sequence
from pagoda_runtime.structured_outputs import StructuredOutputError, StructuredOutputs
from pagoda_runtime.tokenizer import Tokenizer


class GrammarCompiler:
    """Builds the matchers of a request's samples against the model's vocabulary."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        # Logit rows may be wider than the tokenizer (padded embeddings); those ids are never allowed.
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)
        self.eos_token_ids = list(eos_token_ids)

    @cached_property
    def _lltokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use (about half a second): servers that never constrain never pay it.
        return llguidance.LLTokenizer(
            self.tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids
        )

    def matchers(self, spec: StructuredOutputs, n: int) -> list[llguidance.LLMatcher]:
        matcher = llguidance.LLMatcher(self._lltokenizer, spec.to_llguidance(), log_level=0)
        if matcher.is_error():
            raise StructuredOutputError(matcher.get_error())
        return [matcher] + [matcher.deep_copy() for _ in range(n - 1)]


def advance(seq: Sequence, token: int) -> bool:
    """Feed the sampled token to the sequence's matcher; True when the grammar is complete."""
    matcher = seq.grammar
    if matcher is None:
        return False
    matcher.consume_token(token)
    return matcher.is_stopped()


class GrammarMasker:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._executor = llguidance.LLExecutor()
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self._buffer: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        constrained = [(seq.grammar, row) for row, seq in enumerate(seqs) if seq.grammar is not None]
        if not constrained:
            return logits
        batch, vocab = logits.shape
        words = (vocab + 31) // 32
        bitmask = self._bitmask(batch, words)
        bitmask.fill_(-1)  # rows without a grammar allow every token
        llguidance.torch.fill_next_token_bitmask_par(self._executor, constrained, bitmask)
        on_device = bitmask.to(self.device, non_blocking=True)
        allowed = ((on_device.unsqueeze(-1) >> self._shifts) & 1).view(batch, words * 32)[:, :vocab]
        return logits.masked_fill(allowed == 0, float("-inf"))

    def _bitmask(self, batch: int, words: int) -> torch.Tensor:
        # Reused across steps: the previous step's copy finished when its tokens reached the host.
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < batch or buffer.shape[1] != words:
            pinned = self.device.type == "cuda"
            buffer = torch.empty(max(batch, 8), words, dtype=torch.int32, pin_memory=pinned)
            self._buffer = buffer
        return buffer[:batch]
