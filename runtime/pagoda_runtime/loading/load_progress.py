"""How far start-up is: the phase, and while weights load, tensors and bytes so far and the rate.

One tracker per process (`LOAD_PROGRESS`): the engine advances it, the log prints it per decoder
layer, and `/health/ready` returns it in its body while the model loads, so `kubectl describe pod`
and a curl both say what a starting pod is doing instead of nothing for minutes.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

log = logging.getLogger("pagoda.load")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def weight_nbytes(weight) -> int:
    """Bytes of a float tensor, or of every tensor of a PackedWeight (its stored blocks and scales)."""
    if hasattr(weight, "element_size"):
        return weight.numel() * weight.element_size()
    return sum(t.numel() * t.element_size() for t in vars(weight).values() if hasattr(t, "element_size"))


@dataclass(frozen=True)
class Snapshot:
    phase: str
    tensors: int = 0
    total_tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def percent(self) -> int | None:
        return self.tensors * 100 // self.total_tensors if self.total_tensors else None

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        if not self.total_tensors:
            return self.phase
        return (
            f"{self.phase}: {self.tensors}/{self.total_tensors} tensors ({self.percent}%), "
            f"{self.bytes / 1e9:.2f} GB in {self.seconds:.1f}s ({self.bytes_per_second / 1e9:.2f} GB/s)"
        )

    def to_json(self) -> dict:
        body = {"phase": self.phase}
        if self.total_tensors:
            body |= {
                "tensors": self.tensors,
                "total_tensors": self.total_tensors,
                "percent": self.percent,
                "bytes": self.bytes,
                "bytes_per_second": round(self.bytes_per_second),
            }
        return body


class LoadProgress:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot = Snapshot("starting")

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def phase(self, name: str) -> None:
        with self._lock:
            self._snapshot = Snapshot(name)
        log.info("start-up: %s", name)

    def track(self, weights: Iterable, total_tensors: int, num_layers: int) -> Iterator:
        """Passes the weights through, counting them and logging once per decoder layer."""
        started = time.monotonic()
        done = 0
        layer = None

        for tensors, (name, weight) in enumerate(weights, 1):
            done += weight_nbytes(weight)
            match = _LAYER.match(name)
            current = int(match.group(1)) if match else None
            with self._lock:
                self._snapshot = Snapshot(
                    "loading weights", tensors, total_tensors, done, time.monotonic() - started
                )
            if layer is not None and current != layer:
                log.info("loaded layer %d/%d; %s", layer + 1, num_layers, self.snapshot().describe())
            layer = current
            yield name, weight
        if layer is not None:
            log.info("loaded layer %d/%d; %s", layer + 1, num_layers, self.snapshot().describe())
        log.info("loaded all weights; %s", self.snapshot().describe())
        self.phase("allocating the KV cache")


LOAD_PROGRESS = LoadProgress()
