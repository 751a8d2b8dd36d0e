"""The asyncio front the server uses: one request = one async stream of RequestOutputs.

A background task runs the engine's steps in a worker thread (torch releases the GIL while it
computes), so the event loop keeps serving while the model runs. New requests and aborts are
queued and applied between steps, on the loop, so the engine is only ever touched by one step
at a time.

A step that raises fails only the requests it ran (each stream gets `RequestFailed`, the server
answers 500) and the loop goes on with the rest; only a broken device or tensor-parallel group
(devices.is_device_failure), or any failed step of a group, whose ranks may then disagree on what
ran, stops the loop for good, which `errored` reports to the liveness probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.memory_report import MemoryReport
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.protocol import RequestFailed, ServedLora
from pagoda_runtime.engine.request_state import Request
from pagoda_runtime.engine.request_validation import RequestRejected
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.stats import EngineStats
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.executor.devices import is_device_failure

log = logging.getLogger("pagoda.engine")

# An idle loop still wakes this often, so that last_heartbeat shows it is alive.
IDLE_TICK_S = 0.5


class AsyncLLMEngine:
    """Satisfies engine_protocol.ServingEngine, the contract the server is typed against."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.last_heartbeat = time.monotonic()
        self.errored: BaseException | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._new: list[Request] = []
        self._aborts: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-engine")

    @classmethod
    def from_engine_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        return cls(LLMEngine(config))

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def sampling_defaults(self) -> dict[str, float]:
        return self.engine.sampling_defaults

    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.architecture.vocab_size

    @property
    def memory(self) -> MemoryReport:
        return self.engine.memory

    @property
    def scheduling_policy(self) -> str:
        return self.engine.engine_config.scheduling_policy

    @property
    def pooling_task(self) -> str | None:
        return self.engine.pooling_task

    @property
    def class_labels(self) -> tuple[str, ...]:
        classifier = self.engine.model_config.classifier
        return classifier.labels if classifier is not None else ()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="pagoda-engine-loop")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # A loop that stopped on an error has logged it and holds it in `errored`.
            await asyncio.gather(self._task, return_exceptions=True)
        # A step still running in the worker thread finishes before the engine is touched here.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
        self.abort_all()
        self._apply_pending()

    def lora_adapters(self) -> dict[str, ServedLora]:
        return self.engine.lora_adapters()

    async def add_lora(self, name: str, path: str) -> None:
        # Reading the folder takes a while; the manager is safe to change while a step runs.
        await asyncio.get_running_loop().run_in_executor(None, self.engine.add_lora, name, path)

    async def remove_lora(self, name: str) -> None:
        self.engine.remove_lora(name)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        request_id: str,
        internal: bool = False,
        priority: int = 0,
        lora_name: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        if self.errored is not None:
            raise RequestFailed(f"the engine stopped after an error: {self.errored}") from self.errored
        if self._task is None:
            raise RuntimeError("the engine is not started; await engine.start() first")
        if request_id in self._streams:
            raise RequestRejected(f"A request with id {request_id!r} is already running; use a unique id.")
        request = self.engine.make_request(
            request_id, prompt, params, internal=internal, priority=priority, lora_name=lora_name
        )
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        self._new.append(request)
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, RequestFailed):
                    raise item
                if isinstance(item, BaseException):
                    raise RequestFailed(f"the engine stopped after an error: {item}") from item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                # The consumer went away (cancelled, disconnected): stop spending work on it.
                self._aborts.append(request_id)
                self._wake.set()
            self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._aborts.append(request_id)
        self._wake.set()

    def abort_all(self) -> None:
        self._aborts.extend(self._streams)
        self._aborts.extend(r.request_id for r in self._new)
        if self._wake is not None:
            self._wake.set()

    # ---- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self.last_heartbeat = time.monotonic()
                self._apply_pending()
                if not self.engine.has_unfinished():
                    self._wake.clear()
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation
                    # that arrives as the wait ends (a request's abort waking the loop just as the
                    # server shuts down), and the loop then ticked on forever.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(IDLE_TICK_S):
                            await self._wake.wait()
                    continue
                try:
                    outputs = await loop.run_in_executor(self._executor, self.engine.step)
                except Exception as error:
                    # In a tensor-parallel group the ranks may no longer agree on what ran.
                    if is_device_failure(error) or self.engine.runner.tp.size > 1:
                        raise
                    self._fail_step(error)
                    continue
                for output in outputs:
                    queue = self._streams.get(output.request_id)
                    if queue is not None:
                        queue.put_nowait(output)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self.errored = error
            log.critical("the engine loop stopped: %s: %s", type(error).__name__, error, exc_info=error)
            for queue in self._streams.values():
                queue.put_nowait(error)
            raise

    def _fail_step(self, error: Exception) -> None:
        failed = self.engine.fail_step()
        log.error(
            "a step raised %s: %s; its %d requests fail with an internal error and the engine serves on",
            type(error).__name__,
            error,
            len(failed),
            exc_info=error,
        )
        for request_id in failed:
            queue = self._streams.get(request_id)
            if queue is not None:
                queue.put_nowait(RequestFailed(f"a step that ran this request failed: {error}"))

    def _apply_pending(self) -> None:
        new, self._new = self._new, []
        for request in new:
            self.engine.add(request)
        aborts, self._aborts = self._aborts, []
        for request_id in dict.fromkeys(aborts):
            output = self.engine.abort(request_id)
            queue = self._streams.get(request_id)
            if output is not None and queue is not None:
                queue.put_nowait(output)
