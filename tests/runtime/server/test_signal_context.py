"""A signal that lands while a request's code runs must not tag the drain with that request's id."""

from __future__ import annotations

import asyncio
import io
import logging
import signal

import uvicorn
from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.logs import RequestIdFilter, TextFormatter, request_id_var
from pagoda_runtime.server.process import _Server
from pagoda_runtime.server.state import ServerState


def test_drain_summary_carries_no_request_id_of_the_interrupted_request(tmp_path):
    termination_log = tmp_path / "termination-log"
    state = ServerState(ServerSettings(served_model_names=("m",)))
    server = _Server(uvicorn.Config(app=None), state, str(termination_log))
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(TextFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("pagoda.server")
    logger.addHandler(handler)
    previous_level = logger.level
    logger.setLevel(logging.INFO)

    async def interrupted_request() -> None:
        server._loop = asyncio.get_running_loop()
        # As the signal handler runs: between two bytecodes of a request's task.
        request_id_var.set("req-being-served")
        server.handle_exit(signal.SIGTERM, None)
        while not server.should_exit:
            await asyncio.sleep(0.01)

    try:
        asyncio.run(interrupted_request())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
    summary = termination_log.read_text()
    assert summary.startswith("drained in") and "request_id" not in summary, summary
    logged = lines.getvalue()
    assert "draining for up to" in logged and "drained in" in logged, logged
    assert "req-being-served" not in logged, logged
