"""Download progress: one JSON line in the download Job's log, which the operator reads back.

The Job's log is the channel because it needs no write access to the cluster: the operator reads
the last line of the pod's log (`pods/log`), and `parse_progress` is the one reader of the format.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

EVENT = "model_download_progress"


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    bytes_per_second: float = 0.0

    @property
    def percent(self) -> int:
        return 100 if self.total <= 0 else min(100, self.done * 100 // self.total)

    def line(self) -> str:
        return json.dumps(
            {
                "event": EVENT,
                "done": self.done,
                "total": self.total,
                "bytes_per_second": round(self.bytes_per_second),
            }
        )


def parse_progress(log_tail: str) -> Progress | None:
    """The last progress line in a log excerpt, or None when it holds none."""
    for line in reversed(log_tail.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == EVENT:
            return Progress(
                int(record["done"]), int(record["total"]), float(record.get("bytes_per_second", 0))
            )
    return None


def bytes_under(folder: Path) -> int:
    """Bytes on disk below a folder, counting partial files: what has arrived so far."""
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except FileNotFoundError:  # renamed while we walked
            continue
    return total


class ProgressReporter:
    """Emits a progress line every `interval` seconds from a background thread, and a last one at stop."""

    def __init__(self, folder: Path, total: int, emit: Callable[[str], None], interval: float = 5.0):
        self.folder, self.total, self.emit, self.interval = folder, total, emit, interval
        self._last = (bytes_under(folder), time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.report()

    def report(self) -> Progress:
        done = min(bytes_under(self.folder), self.total)
        now = time.monotonic()
        rate = (done - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (done, now)
        progress = Progress(done, self.total, max(rate, 0.0))
        self.emit(progress.line())
        return progress

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()
