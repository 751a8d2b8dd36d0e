"""The termination-message file: one line a failed process leaves for Kubernetes to show in the
pod's status (and the operator to surface), written by the server, the rank processes and the
download and sizing Jobs alike."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pagoda_runtime.contract.names import TERMINATION_LOG

log = logging.getLogger("pagoda")

# Kubernetes keeps at most this much of the termination message.
_TERMINATION_MESSAGE_LIMIT = 4096


def default_termination_log() -> str | None:
    path = Path(TERMINATION_LOG)
    writable = os.access(path, os.W_OK) if path.exists() else os.access(path.parent, os.W_OK)
    return str(path) if writable else None


def write_termination_message(path: str | None, message: str) -> None:
    if path is None:
        return
    try:
        Path(path).write_text(message[:_TERMINATION_MESSAGE_LIMIT] + "\n")
    except OSError as exc:
        log.error("could not write the termination message to %s: %s", path, exc)
