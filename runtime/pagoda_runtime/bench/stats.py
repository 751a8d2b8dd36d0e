"""Latency percentiles shared by the benchmarks."""

from __future__ import annotations

import math
import statistics


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pct(q: float) -> float:
        # Linear interpolation between closest ranks, as numpy.percentile does by default.
        rank = (len(ordered) - 1) * q / 100
        low, high = math.floor(rank), math.ceil(rank)
        return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)

    return {"mean": statistics.fmean(ordered), "p50": pct(50), "p95": pct(95), "p99": pct(99)}
