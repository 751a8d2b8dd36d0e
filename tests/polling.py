"""The one way tests wait: poll until a value is accepted, or fail saying what was awaited."""

from __future__ import annotations

import time


def wait_for(fetch, *, check=bool, timeout: float = 30.0, what: str, interval: float = 0.25, details=None):
    """Polls `fetch()` until `check` accepts its value and returns that value; a timeout names `what`,
    the last value and, from `details()`, whatever else explains it (such as the operator's log)."""
    deadline = time.monotonic() + timeout
    while True:
        last = fetch()
        if check(last):
            return last
        if time.monotonic() > deadline:
            extra = f"\n{details()}" if details else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}{extra}")
        time.sleep(interval)
