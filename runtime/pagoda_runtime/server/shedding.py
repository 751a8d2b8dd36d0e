"""Which queued request makes room when the queue is full and a more urgent one arrives.

Under `--scheduling-policy priority` the `--max-queue` bound is kept for the most urgent requests:
when it is reached, a new request is admitted if it outranks (engine/priority.py: priority, then
arrival, with ageing) the worst-ranked request whose response has not started; that one is shed,
its client answered 429 with Retry-After like a request refused at the door. Otherwise the new one
gets the 429. A request whose response has started (its first token streamed or being returned) is
never shed: shedding is for work that has not been delivered yet. Under fcfs nothing is shed.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from pagoda_runtime.engine.priority import rank


@dataclass
class _Queued:
    rank: float
    order: int  # admission order: breaks ties of rank, latest shed first
    shed: bool = False


class QueuedRequests:
    """Admitted requests that have produced no output yet, by request id."""

    def __init__(self) -> None:
        self._by_id: dict[str, _Queued] = {}
        self._order = itertools.count()
        self.num_shed = 0  # shed, still counted in flight until their answer is out

    def enter(self, request_id: str, priority: int) -> None:
        self._by_id[request_id] = _Queued(rank(priority, time.monotonic()), next(self._order))

    def leave(self, request_id: str) -> bool:
        """The request produced its first output or ended; whether it was shed meanwhile."""
        queued = self._by_id.pop(request_id, None)
        if queued is None or not queued.shed:
            return False
        self.num_shed -= 1
        return True

    def shed_for(self, priority: int) -> str | None:
        """Marks the worst-ranked queued request shed if a request of `priority` arriving now
        outranks it, and returns its id; None when none is outranked."""
        newcomer = rank(priority, time.monotonic())
        candidates = [(q.rank, q.order, i) for i, q in self._by_id.items() if not q.shed]
        if not candidates:
            return None
        worst_rank, _, request_id = max(candidates)
        if worst_rank <= newcomer:
            return None
        self._by_id[request_id].shed = True
        self.num_shed += 1
        return request_id
