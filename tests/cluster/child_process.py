"""A process a test starts that cannot outlive it: own process group, killed with its parent.

Runtimes and Prometheus servers left behind by a failed or interrupted run would hold ports and
CPU on a shared machine; Linux's parent-death signal ends them even if pytest itself is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ChildProcess:
    def __init__(self, command: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_http_ok(self, url: str, timeout: float) -> None:
        """Until url answers 200; fails at once, with the log's tail, if the process exits."""
        name = Path(self.process.args[0]).name
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{name} exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=5).status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError(f"{url} did not answer 200 within {timeout:g}s:\n{self.log()[-3000:]}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole group, SIGKILL whatever is left after the grace period."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(grace)
        self._log.close()
