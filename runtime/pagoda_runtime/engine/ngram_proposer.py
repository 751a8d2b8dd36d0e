"""N-gram prompt lookup: draft tokens for speculative decoding from the sequence's own tokens.

Text that quotes its context (a summary citing its source, an edit of given code, a JSON echo of
its input) repeats long runs of earlier tokens. The sequence's last n tokens (the longest n from
prompt_lookup_max down to prompt_lookup_min that occurred before) are looked up in its earlier
tokens, and the up to K tokens that followed that occurrence are the draft: no model, a few
microseconds of numpy per sequence. The target verifies the draft in its next step
(executor/rejection_sampler.py), so a wrong guess costs a query position, never a wrong token.

A grammar-constrained sample's draft is cut before the first token its grammar refuses, and after
the one that completes it: JSON that echoes its input is where lookup drafts pay most. The cut
keeps the output the target's because each drafted token is a function of the tokens before it,
so whether position j is drafted is decided by the history alone (rejection_sampler.py).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.grammar_mask import allowed_draft
from pagoda_runtime.engine.sequence import Sequence


def ngram_lookup(token_ids: list[int], k: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Up to k tokens that followed an earlier occurrence of the longest suffix n-gram of
    `token_ids` (lookup_max >= n >= lookup_min), [] where none occurred. Of several occurrences the
    latest one with k tokens after it wins (the nearest context), else the earliest (the most
    tokens after it)."""
    length = len(token_ids)
    if length < lookup_min + 1 or k < 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        # Windows starting before the suffix itself: an occurrence with at least one token after it.
        windows = sliding_window_view(tokens[: length - 1], n)
        starts = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if starts.shape[0] == 0:
            continue
        full = starts[starts + n + k <= length]
        start = int(full[-1] if full.shape[0] else starts[0]) + n
        return token_ids[start : start + k]
    return []


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[tuple[list[int], None]]:
        """The drafts of decoding sequences whose tokens the host knows: at most each one's limit
        of tokens, none past its max_tokens or context, a constrained sample's only as far as its
        grammar allows."""
        config = self.config
        drafts = []
        for seq, limit in zip(seqs, limits, strict=True):
            k = draft_room(seq, min(config.num_speculative_tokens, limit))
            if seq.num_pending:
                k = 0
            draft = ngram_lookup(seq.token_ids, k, config.prompt_lookup_max, config.prompt_lookup_min)
            drafts.append((draft[: allowed_draft(seq.grammar, draft)], None))
        return drafts

    def free(self, seq: Sequence) -> None:
        """A lookup keeps nothing per sequence."""


def draft_room(seq: Sequence, k: int) -> int:
    """How many of `k` draft tokens fit before the sequence's max_tokens or context: the target's own
    token after an accepted draft is the last one."""
    if seq.max_num_tokens is None:
        return k
    return min(k, seq.max_num_tokens - seq.num_tokens - 1)
