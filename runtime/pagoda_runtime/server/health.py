"""Kubernetes health: liveness from the engine loop's heartbeat, readiness from a real canary.

Liveness only asks "is the loop still turning", so a busy pod is never restarted. Readiness asks
"can this pod generate right now", answered by a few greedy tokens through the real engine on a
timer; probes read the last result instead of each one costing a generation. A canary that waits
out its timeout behind a full queue while client tokens keep flowing has its answer all the same:
the pod is busy and healthy, and stays ready, so that shared overload is shed by 429s instead of
taking every replica out of the Service at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.protocol import RequestFailed, ServingEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.loading.load_progress import LOAD_PROGRESS

log = logging.getLogger("pagoda.health")

# A single engine step on a loaded CPU can take seconds; a loop silent for this long is stuck.
LIVENESS_MAX_HEARTBEAT_AGE_S = 60.0
CANARY_PROMPT = "Hello"
CANARY_TOKENS = 2


@dataclass
class Check:
    ok: bool
    detail: str


class Health:
    def __init__(self, canary_interval: float, canary_timeout: float) -> None:
        self.canary_interval = canary_interval
        self.canary_timeout = canary_timeout
        self.tokens_at: float | None = None  # when a client request last received tokens
        self.canary_ok_at: float | None = None
        self.canary_error: str | None = "no canary has run yet"
        self._ids = itertools.count()

    def saw_tokens(self) -> None:
        self.tokens_at = time.monotonic()

    async def run_canaries(self, engine: ServingEngine, is_draining: Callable[[], bool]) -> None:
        while not is_draining():
            await self._canary(engine)
            await asyncio.sleep(self.canary_interval)

    async def _canary(self, engine: ServingEngine) -> None:
        # A pooling server's canary pools the prompt (one hidden token, which the output leaves out).
        pooled = engine.pooling_task is not None
        params = (
            PoolingParams(task=engine.pooling_task)
            if pooled
            else SamplingParams(max_tokens=CANARY_TOKENS, temperature=0.0, ignore_eos=True)
        )
        prompt = engine.tokenizer.encode(CANARY_PROMPT)
        final = None
        try:
            async with asyncio.timeout(self.canary_timeout):
                async for out in engine.generate(prompt, params, f"canary-{next(self._ids)}", internal=True):
                    final = out
        except TimeoutError:
            if self.tokens_at is not None and time.monotonic() - self.tokens_at < self.canary_timeout:
                self._succeed()
                return
            self._fail(f"the canary generation took longer than {self.canary_timeout:g}s")
            return
        except RequestFailed:
            if engine.errored is None:
                # A step it shared with another request failed and the engine served on: no news.
                return
            self._fail(f"the engine stopped: {engine.errored}")
            return
        except Exception as exc:  # an engine failure makes the pod unready, not the server dead
            self._fail(f"the canary generation failed: {exc}")
            return
        if pooled:
            if final is None or not final.pooled:
                self._fail("the canary pooling produced no vector")
            else:
                self._succeed()
            return
        produced = len(final.outputs[0].token_ids) if final is not None else 0
        if produced != CANARY_TOKENS:
            self._fail(f"the canary generation produced {produced} tokens instead of {CANARY_TOKENS}")
            return
        self._succeed()

    def _succeed(self) -> None:
        self.canary_ok_at = time.monotonic()
        self.canary_error = None

    def _fail(self, message: str) -> None:
        if self.canary_error != message:
            log.warning(message)
        self.canary_error = message

    def live(self, engine: ServingEngine | None) -> Check:
        if engine is None:
            return Check(True, "the model is loading")
        if engine.errored is not None:
            return Check(False, f"the engine loop died: {engine.errored}")
        age = time.monotonic() - engine.last_heartbeat
        if age > LIVENESS_MAX_HEARTBEAT_AGE_S:
            return Check(False, f"the engine loop has not ticked for {age:.0f}s")
        return Check(True, f"the engine loop ticked {age:.1f}s ago")

    def ready(self, engine: ServingEngine | None, load_error: str | None, draining: bool) -> dict[str, Check]:
        if engine is None:
            loaded = Check(False, load_error or LOAD_PROGRESS.snapshot().describe())
        else:
            loaded = Check(True, "the model is loaded")
        loop = self.live(engine) if engine is not None else Check(False, "the engine loop has not started")
        return {
            "model_loaded": loaded,
            "engine_loop": loop,
            "canary": self._canary_check(),
            "not_draining": Check(
                not draining, "draining for shutdown" if draining else "accepting requests"
            ),
        }

    def _canary_check(self) -> Check:
        if self.canary_error is not None:
            return Check(False, self.canary_error)
        age = time.monotonic() - self.canary_ok_at
        # The last attempt succeeded; if it is this old the canary loop itself has stalled.
        if age > 2 * self.canary_interval + self.canary_timeout:
            return Check(False, f"the last successful canary was {age:.0f}s ago")
        return Check(True, f"the last canary succeeded {age:.1f}s ago")
