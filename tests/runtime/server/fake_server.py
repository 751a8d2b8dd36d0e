"""Runs the real serving process (uvicorn, signals, drain) over the fake engine: `python fake_server.py PORT`.

This lets the process-level behaviour (SIGTERM drain, disconnects over a real socket, admission
under real concurrency) be tested in seconds; the same behaviours are tested again with the real
engine and the bundled model in test_server_lifecycle.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402
from pagoda_runtime.contract.serve_settings import ServerSettings  # noqa: E402
from pagoda_runtime.logs import configure_logging  # noqa: E402
from pagoda_runtime.server.process import serve  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--step-s", type=float, default=0.02)
    parser.add_argument("--max-running", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=None)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--canary-interval", type=float, default=0.2)
    parser.add_argument("--canary-timeout", type=float, default=60.0)
    args = parser.parse_args()
    configure_logging("json")
    engine = FakeEngine(step_s=args.step_s, max_running=args.max_running)

    async def load():
        await engine.start()
        return engine

    settings = ServerSettings(
        served_model_names=("fake-model",),
        max_num_seqs=args.max_running,
        max_queue=args.max_queue,
        canary_timeout=args.canary_timeout,
        drain_timeout=args.drain_timeout,
        canary_interval=args.canary_interval,
    )
    return serve(load, settings, "127.0.0.1", args.port, None)


if __name__ == "__main__":
    sys.exit(main())
