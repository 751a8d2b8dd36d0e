"""Graceful drain: after SIGTERM, finish what was accepted, refuse what is new, then let go.

Kubernetes keeps routing to a pod for a few seconds after it starts terminating, so new requests
are answered 503 with Retry-After (the client retries elsewhere) rather than by a closed socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

RETRY_AFTER_S = 2
# After aborting at the timeout, streams still have to send their final chunk and [DONE].
_ABORT_GRACE_S = 10.0


class Drain:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.draining = False
        self.in_flight = 0
        self.refused = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._started_at = 0.0
        self._in_flight_at_start = 0
        self._aborted_by_signal = 0

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Counts one accepted request for as long as its response is being produced."""
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def begin(self) -> None:
        self.draining = True
        self._started_at = time.monotonic()
        self._in_flight_at_start = self.in_flight

    def abort_now(self, abort_all: Callable[[], None] | None) -> None:
        """A second signal: abort what is in flight; wait() then reports them as aborted."""
        self._aborted_by_signal = self.in_flight
        if abort_all is not None:
            abort_all()

    async def wait(self, abort_all: Callable[[], None] | None) -> str:
        """Waits for accepted requests up to the timeout, aborts the rest; returns a one-line summary."""
        aborted = 0
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the wait ends (engine/async_engine.py's loop hung a shutdown that way).
        try:
            async with asyncio.timeout(self.timeout):
                await self._idle.wait()
        except TimeoutError:
            aborted = self.in_flight - self._aborted_by_signal
            if abort_all is not None:
                abort_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_ABORT_GRACE_S):
                    await self._idle.wait()
        by_signal = self._aborted_by_signal
        finished = self._in_flight_at_start - aborted - by_signal
        return (
            f"drained in {time.monotonic() - self._started_at:.1f}s: "
            f"{finished} in-flight requests completed, "
            f"{aborted} aborted at the {self.timeout:g}s drain timeout, "
            + (f"{by_signal} aborted by a second signal, " if by_signal else "")
            + f"{self.refused} new requests refused"
        )
