"""Speculative decoding's verification: which drafted tokens the target keeps, and the token after.

A sequence that speculates runs its last token and its K draft tokens through the target in one
step, which yields K + 1 distributions p_0 .. p_K, p_j the target's for the token after draft
token j - 1 (the sampler's own: penalties, the min_tokens mask, temperature, top-k, top-p and
min-p applied as when it samples, `target_probs`). Draft token x_j is accepted with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection the position is resampled from the residual
max(0, p_j - q_j), normalized; when every draft token is accepted one more token is drawn from
p_K. Whatever q is, each emitted token is then distributed exactly as the target would have
sampled it (Leviathan et al., 2023; Chen et al., 2023). The n-gram proposer's q is a point mass
(q(x) = 1): acceptance is p(x), the residual p without x. A draft model's q is the distribution it
drew x from (engine/draft_model_proposer.py). A greedy row's p is the point mass on its argmax, so
greedy decoding keeps exactly the target's own tokens.

Under a grammar (structured output) each row's p_j is masked by the grammar's state after the
draft tokens before row j (engine/grammar_mask.py), so the output is the constrained target's. A
draft may be cut for anything known before a position (the history and the draft tokens before
it): a position drafted or not, its token follows p_j. It may not be cut for the token drawn at
that position: cutting a token x_j ~ q that the grammar refuses replaces the residual draw by a
draw from p exactly when q drew a refused token, which over-weights p by q's refused mass. An
n-gram draft token is a function of the history, so cutting it there is decided before the
position; a draft model's q is masked by the grammar instead, so it never draws a refused token
and is still the distribution x_j came from. (A draft that ignores the grammar and is verified
whole stays lossless too, its refused tokens rejected since p is 0 there, but it emits less.)

Rows are flat: sequence s owns widths[s] consecutive rows (its K drafted positions, then the
bonus one); `draft_tokens` holds each row's draft token, -1 on the bonus rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Drafts:
    """The draft tokens a verify step checks, one list per sequence that samples in it (empty for
    a sequence that does not speculate)."""

    tokens: list[list[int]]
    # Per sequence, the q [len(draft), vocab] a draft model drew its draft from; None: point masses.
    probs: list[Any] | None = None

    @property
    def widths(self) -> list[int]:
        """Each sequence's rows: one per draft token, and the bonus one."""
        return [len(d) + 1 for d in self.tokens]

    def row_tokens(self) -> list[int]:
        """Each row's draft token, -1 on the bonus rows."""
        return [t for draft in self.tokens for t in (*draft, -1)]

    def row_probs(self, vocab: int, device: torch.device) -> torch.Tensor | None:
        """Each row's q [rows, vocab] (zeros on the bonus rows), None where every draft is a point
        mass (rejection_sample builds those from the tokens)."""
        if self.probs is None or all(q is None for q in self.probs):
            return None
        rows = []
        for draft, q in zip(self.tokens, self.probs, strict=True):
            if q is None:
                q = torch.zeros(len(draft), vocab, device=device)
                q[torch.arange(len(draft)), torch.tensor(draft, dtype=torch.int64)] = 1.0
            rows += [q.to(device=device, dtype=torch.float32), torch.zeros(1, vocab, device=device)]
        return torch.cat(rows)

    def row_prefixes(self) -> list[list[int]]:
        """Each row's draft tokens before it: the history that row's distribution follows."""
        return [draft[:j] for draft in self.tokens for j in range(len(draft) + 1)]


def target_probs(
    logits: torch.Tensor,
    random_rows: torch.Tensor,
    temperature: torch.Tensor,
    kept: torch.Tensor,
) -> torch.Tensor:
    """The distribution [rows, vocab] the sampler draws each row from: the argmax's point mass on
    greedy rows; on `random_rows`, softmax(logits / temperature) over the tokens `kept` (the
    top-k/top-p/min-p mask of those rows)."""
    probs = torch.zeros_like(logits)
    probs.scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    if random_rows.shape[0]:
        scaled = logits[random_rows] / temperature[:, None]
        probs[random_rows] = torch.softmax(torch.where(kept, scaled, float("-inf")), dim=-1)
    return probs


def rejection_sample(
    target: torch.Tensor,
    draft_tokens: torch.Tensor,
    widths: list[int],
    uniform: torch.Tensor,
    noise: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token and each sequence's count of emitted tokens (its accepted draft tokens
    and the one after them). target: p [rows, vocab]; draft_tokens [rows] (-1: bonus row);
    uniform [rows] in [0, 1) for the acceptance tests; noise [rows, vocab] Exp(1) draws for the
    residual (argmax of residual / noise picks a token with probability proportional to it);
    draft_probs: q [rows, vocab], None for a point-mass draft. A row's token is its draft token
    where accepted, the residual's draw elsewhere; rows past a sequence's first rejection are
    not emitted."""
    drafted = draft_tokens >= 0
    x = draft_tokens.clamp(min=0)[:, None]
    q = torch.zeros_like(target).scatter_(1, x, 1.0) if draft_probs is None else draft_probs
    q = q * drafted[:, None]
    p_x, q_x = target.gather(1, x)[:, 0], q.gather(1, x)[:, 0]
    # u < p / q, written so that q = 0 (a token the draft could not have drawn) never divides.
    accepted = drafted & (uniform * q_x < p_x)
    residual = (target - q).clamp(min=0)
    tokens = torch.where(accepted, draft_tokens, (residual / noise).argmax(dim=-1))
    return tokens, emitted_counts(accepted, widths)


def emitted_counts(accepted: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """Per sequence: 1 + the length of its run of accepted rows from its first one (the bonus row
    is never accepted, so the run ends within the sequence)."""
    seq = np.repeat(np.arange(len(widths)), widths)
    position = np.arange(len(seq)) - np.repeat(np.cumsum(widths) - widths, widths)
    grid = torch.zeros(len(widths), max(widths), dtype=torch.bool, device=accepted.device)
    index = torch.as_tensor(seq, device=accepted.device), torch.as_tensor(position, device=accepted.device)
    grid[index] = ~accepted
    return grid.int().argmax(dim=-1) + 1
