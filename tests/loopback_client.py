"""What the process-level tests do to a server on loopback: pick a port, read a metric, stream."""

from __future__ import annotations

import json
import socket
import threading

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(url: str, name: str) -> float:
    """The value of an unlabelled (or single-series) metric on url's /metrics."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in {url}/metrics")


def stream_completion(
    url: str, max_tokens: int, record: dict, started: threading.Event | None = None
) -> None:
    """Streams one completion, recording its status, finish reasons, usage and whether [DONE] came.

    Meant to run in a thread: a cut connection, which some tests look for, is recorded in
    record["error"] rather than raised where nobody would see it. started is set at the first chunk.
    """
    body = {
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    record.update(finish_reasons=[], usage=None, done=False, status=None, error=None)
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
            record["status"] = response.status_code
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    record["done"] = True
                elif line.startswith("data: "):
                    chunk = json.loads(line.removeprefix("data: "))
                    record["finish_reasons"] += [
                        c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]
                    ]
                    record["usage"] = chunk.get("usage") or record["usage"]
                    if started is not None:
                        started.set()
    except httpx.HTTPError as exc:
        record["error"] = repr(exc)
