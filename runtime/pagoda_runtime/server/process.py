"""The serving process: uvicorn with Pagoda's signal handling and start-up failure reporting.

The first SIGTERM (or SIGINT) starts a graceful drain; a second one aborts what is in flight (each
stream ends with finish_reason "abort"), logs the same drain summary, and exits with status 1
because accepted work was lost. A start-up
failure ends the process non-zero after writing one line to the termination-message file, which
Kubernetes shows in the pod's status for the operator to surface.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable

import uvicorn

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.server.app import EngineLoader, build_app
from pagoda_runtime.server.state import ServerState
from pagoda_runtime.termination import write_termination_message

log = logging.getLogger("pagoda.server")


async def _in_daemon_thread(fn: Callable[[], object]) -> object:
    """Runs fn in a daemon thread, off the event loop, so that a signal during a long load still ends us."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(setter, value) -> None:
        if not future.done():
            setter(value)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, future.set_exception, exc)
        else:
            loop.call_soon_threadsafe(settle, future.set_result, result)

    threading.Thread(target=run, name="model-loader", daemon=True).start()
    return await future


def engine_loader(engine_config: EngineConfig) -> EngineLoader:
    async def load():
        def construct():
            # Imported here so that torch loads in the background while the probes already get answers.
            from pagoda_runtime.engine.async_engine import AsyncLLMEngine

            return AsyncLLMEngine.from_engine_config(engine_config)

        engine = await _in_daemon_thread(construct)
        await engine.start()
        return engine

    return load


def group_engine_loader(group) -> EngineLoader:
    """Rank 0 of a tensor-parallel group (rank_group.RankGroup): start this node's other ranks,
    join, build the engine on this rank's share of the model; the engine is ready only once
    every rank has loaded, so the readiness canary's first generation already runs on all."""

    async def load():
        def construct():
            from pagoda_runtime.engine.async_engine import AsyncLLMEngine
            from pagoda_runtime.parallel.group_leader import lead_group

            return AsyncLLMEngine(lead_group(group))

        engine = await _in_daemon_thread(construct)
        await engine.start()
        return engine

    return load


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, termination_log: str | None) -> None:
        super().__init__(config)
        self.state = state
        self.termination_log = termination_log
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        # Runs as a signal handler between bytecodes; do the work on the loop. In a fresh context:
        # the interrupted bytecode may be a request's, and its request id would otherwise tag the
        # drain's log lines and the termination message.
        self._loop.call_soon_threadsafe(self._on_signal, sig, context=contextvars.Context())

    def _on_signal(self, sig: int) -> None:
        engine = self.state.engine
        if not self.state.drain.draining:
            log.info(
                "signal %d: draining for up to %gs; a second signal aborts", sig, self.state.drain.timeout
            )
            self.state.drain.begin()
            self._drain_task = asyncio.ensure_future(self._drain())
            return
        log.warning("second signal %d: aborting %d in-flight requests now", sig, self.state.drain.in_flight)
        # The drain task still waiting for idle logs the summary and ends the server; the aborted
        # streams finish within a step, and uvicorn's own shutdown (lifespan included) then runs.
        self.state.drain.abort_now(engine.abort_all if engine is not None else None)
        self.exit_code = 1

    async def _drain(self) -> None:
        engine = self.state.engine
        summary = await self.state.drain.wait(engine.abort_all if engine is not None else None)
        log.info(summary)
        # Kubernetes shows it in the terminated pod's status: what the drain did, in one line.
        write_termination_message(self.termination_log, summary)
        self.should_exit = True

    def fatal(self, message: str) -> None:
        write_termination_message(self.termination_log, message)
        self.exit_code = 1
        self.should_exit = True


def serve(
    load_engine: EngineLoader,
    settings: ServerSettings,
    host: str,
    port: int,
    termination_log: str | None,
) -> int:
    """Serves until drained or failed; returns the process exit code."""
    holder: list[_Server] = []
    app = build_app(
        settings,
        load_engine,
        on_fatal=lambda message: holder[0].fatal(message),
    )
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on")
    server = _Server(config, app.state.pagoda, termination_log)
    holder.append(server)
    try:
        server.run()
    except SystemExit:
        # uvicorn exits this way when it cannot listen (port taken, bad host).
        write_termination_message(termination_log, f"could not listen on {host}:{port}; is the port free?")
        return 1
    return server.exit_code
