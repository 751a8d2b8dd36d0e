"""Constrained sampling on the device: one llguidance matcher per constrained sample, and each
step one bitmask for the whole batch, copied in one transfer and applied with one masked_fill.

The matchers compute their masks on the host while the device still runs the forward pass (the
sampler is reached before anything waits on the device); there is no per-sequence host/device
synchronisation, only the constrained rows are unpacked and written, and a batch with no
constrained sequence skips all of this.

Under speculative decoding a constrained sample drafts too. The matcher only ever holds the tokens
the sequence emitted: a draft is tried on it and rolled back (`allowed_draft`, `advanced_along`),
the proposers cut or mask their drafts with it (ngram_proposer.py, draft_model_proposer.py), and a
verify step's rows are masked by the grammar's state after the draft tokens before each row, all
in the same one bitmask. Why that stays lossless is in executor/rejection_sampler.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property

import llguidance
import llguidance.torch
import torch

from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.engine.structured_outputs import StructuredOutputError, StructuredOutputs
from pagoda_runtime.engine.tokenizer import Tokenizer


class GrammarCompiler:
    """Builds the matchers of a request's samples against the model's vocabulary."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        # The masks are as wide as the logits; ids past the tokenizer's (padded embeddings) are never
        # allowed.
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)

    @cached_property
    def _lltokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use (about half a second): servers that never constrain never pay it.
        if self.tokenizer.vocab_size > self.vocab_size:
            raise StructuredOutputError(
                f"this model's tokenizer has {self.tokenizer.vocab_size} tokens but its output layer "
                f"{self.vocab_size}, so its output cannot be constrained; serve it without structured output"
            )
        try:
            return llguidance.LLTokenizer(
                self.tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids
            )
        except ValueError as exc:
            raise StructuredOutputError(f"llguidance cannot read this model's tokenizer: {exc}") from exc

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


def allowed_draft(matcher: llguidance.LLMatcher | None, draft: list[int]) -> int:
    """How many of the draft's first tokens the grammar takes in a row, the last being the one that
    completes it (a token after the grammar's end is never emitted); the matcher is left as found."""
    if matcher is None:
        return len(draft)
    with advanced_along(matcher) as advance_by:
        for count, token in enumerate(draft):
            if matcher.is_stopped() or not advance_by(token):
                return count
        return len(draft)


@contextmanager
def advanced_along(matcher: llguidance.LLMatcher) -> Iterator:
    """Lend the matcher for trying draft tokens: the yielded function consumes one token if the
    grammar allows it (True) and leaves the matcher as it was if not (False); on leaving, every
    token consumed is rolled back, whatever happened in between."""
    consumed = 0

    def advance_by(token: int) -> bool:
        nonlocal consumed
        taken = matcher.try_consume_tokens([token])
        consumed += taken
        return taken == 1

    try:
        yield advance_by
    finally:
        if consumed:
            matcher.rollback(consumed)


class GrammarMasker:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self._pinned = device.type == "cuda"
        self._bitmask: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None

    @staticmethod
    def constrained_rows(seqs: list[Sequence]) -> list[int]:
        # A sample that ended meanwhile (async scheduling) computes one token more, which is
        # dropped: its matcher has nothing left to allow.
        return [row for row, seq in enumerate(seqs) if seq.grammar is not None and not seq.is_finished]

    def constrains(self, seqs: list[Sequence]) -> bool:
        return any(seq.grammar is not None and not seq.is_finished for seq in seqs)

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], prefixes: list[list[int]] | None = None
    ) -> torch.Tensor:
        """The logits with every token a constrained row's grammar forbids at -inf (in place).
        `prefixes`: of a verify step, each row's draft tokens before it (Drafts.row_prefixes: a
        sequence's rows in a run, each prefix one token longer); the row is masked by the grammar
        as it will be after them."""
        rows = self.constrained_rows(seqs)
        if not rows:
            return logits
        vocab = logits.shape[1]
        words = (vocab + 31) // 32
        bitmask = self._buffers(len(seqs), words)[: len(rows)]
        # One matcher after the other: llguidance's thread-pool fill was 100x slower on a busy
        # 2-core host (BENCHMARKS.md), and a mask takes tens of microseconds.
        if prefixes is None:
            for k, row in enumerate(rows):
                llguidance.torch.fill_next_token_bitmask(seqs[row].grammar, bitmask, k)
        else:
            self._fill_along_drafts(bitmask, rows, seqs, prefixes)
        on_device = bitmask.to(self.device, non_blocking=True)
        bits = (on_device.unsqueeze(-1) >> self._shifts) & 1
        forbidden = bits.view(len(rows), words * 32)[:, :vocab] == 0
        if len(rows) == len(seqs):
            return logits.masked_fill_(forbidden, float("-inf"))
        # Only the constrained rows are unpacked and written: the others in the batch pay nothing.
        self._rows[: len(rows)] = torch.tensor(rows)
        index = self._rows[: len(rows)].to(self.device, non_blocking=True)
        logits[index] = logits[index].masked_fill(forbidden, float("-inf"))
        return logits

    @staticmethod
    def _fill_along_drafts(
        bitmask: torch.Tensor, rows: list[int], seqs: list[Sequence], prefixes: list[list[int]]
    ) -> None:
        """Each row's mask after its draft prefix: a sequence's matcher advances along its draft
        row by row and is rolled back after its last row. A draft token the grammar refuses (no
        proposer drafts one) stops the advance: the row before it forbids it, so the target never
        accepts it and the rows after it are never emitted."""
        k = 0
        while k < len(rows):
            matcher = seqs[rows[k]].grammar
            with advanced_along(matcher) as advance_by:
                taken, refused = 0, False
                while k < len(rows) and seqs[rows[k]].grammar is matcher:
                    prefix = prefixes[rows[k]]
                    while not refused and taken < len(prefix):
                        refused = not advance_by(prefix[taken])
                        taken += 1
                    llguidance.torch.fill_next_token_bitmask(matcher, bitmask, k)
                    k += 1

    def _buffers(self, batch: int, words: int) -> torch.Tensor:
        # Host buffers reused across steps (pinned on a GPU, so the copies do not block): the
        # previous step's copies are done, its sampled tokens having reached the host since (with
        # async scheduling a constrained batch is sampled only after the previous step is read).
        if self._bitmask is None or self._bitmask.shape[0] < batch or self._bitmask.shape[1] != words:
            size = max(batch, 8)
            self._bitmask = torch.empty(size, words, dtype=torch.int32, pin_memory=self._pinned)
            self._rows = torch.empty(size, dtype=torch.int64, pin_memory=self._pinned)
        return self._bitmask
