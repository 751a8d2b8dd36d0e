"""The order requests are served in under `--scheduling-policy priority`, and the ageing that keeps
a low-priority request from being passed over forever.

A request's rank is `priority + arrival_time / AGEING_S`: lower ranks are served first. Among
requests of one priority that is arrival order; across priorities, every AGEING_S seconds a request
has waited counts as one priority level. All waiting requests age at the same rate, so the order of
two requests never changes while they wait and the rank is fixed at arrival: a request of priority p
is passed by a later arrival of priority q < p only if that one arrives within (p - q) * AGEING_S
seconds after it, so it waits behind a bounded set of requests and never starves. The scheduler
(waiting order, preemption victim) and the server's load shedding (server/shedding.py) both rank
by this one rule. Plain Python.
"""

from __future__ import annotations

# Seconds of waiting worth one priority level: a batch request one level below interactive traffic
# is served ahead of interactive requests that arrive more than a minute after it.
AGEING_S = 60.0


def rank(priority: int, arrival_time: float) -> float:
    """Lower is served first; `arrival_time` in time.monotonic() seconds."""
    return priority + arrival_time / AGEING_S
