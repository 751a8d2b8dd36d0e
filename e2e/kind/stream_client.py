"""A client for the kind e2e: streams completions and fails if any stream ends without
finish_reason or [DONE]. Standard library only, so it runs on any host with python3."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request


def stream_once(url: str, max_tokens: int) -> str:
    body = json.dumps(
        {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True}
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    finish_reason, done = None, False
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            finish_reason = chunk["choices"][0].get("finish_reason") or finish_reason
    if not done or finish_reason is None:
        raise RuntimeError(f"stream ended early (finish_reason={finish_reason}, done={done})")
    return finish_reason


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    if args.once:
        print("finish_reason:", stream_once(args.url, 16))
        return 0

    results: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + args.duration

    def worker() -> None:
        while time.monotonic() < deadline:
            try:
                results.append(stream_once(args.url, 64))
            except Exception as error:  # every failure is a lost request: report them all
                errors.append(repr(error))

    threads = [threading.Thread(target=worker) for _ in range(args.streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"completed={len(results)} failed={len(errors)}")
    for error in errors:
        print("error:", error)
    return 1 if errors or not results else 0


if __name__ == "__main__":
    sys.exit(main())
