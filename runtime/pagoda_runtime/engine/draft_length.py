"""Adaptive draft length: how many tokens a sequence may have drafted in its next step.

Every drafted token costs the target a query position (and a draft model a forward) whether or not
it is kept. Each sequence starts at K (num_speculative_tokens); a verify step that kept every
drafted token raises its limit by 2, one that rejected any lowers it by 1, never below 1 nor above
K: the rule of Hugging Face's assisted generation ("heuristic" schedule). Text the proposer cannot
predict drafts one token a step; once a copy starts, the drafts are back at K within a few steps.
"""

from __future__ import annotations

from pagoda_runtime.engine.sequence import Sequence


class DraftLengths:
    def __init__(self, most: int) -> None:
        self.most = most  # K
        self._limits: dict[int, int] = {}  # seq_id -> its limit, where it is below K

    def limit(self, seq: Sequence) -> int:
        return self._limits.get(seq.seq_id, self.most)

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """A verify step of `seq` kept `accepted` of its `drafted` tokens."""
        current = self.limit(seq)
        limit = min(self.most, current + 2) if accepted == drafted else max(1, current - 1)
        if limit == self.most:
            self._limits.pop(seq.seq_id, None)
        else:
            self._limits[seq.seq_id] = limit

    def forget(self, seq: Sequence) -> None:
        self._limits.pop(seq.seq_id, None)
