"""One admitted request's way through the engine and back out as a response, for both endpoints.

Sampling parameters, per-token metrics, the in-flight count the drain waits on, and the rule that
a request whose client went away is aborted at once so its KV blocks go back to the pool. A
request the engine accepted but could not finish (a step that ran it raised) is a 500 naming an
internal error: before the first chunk as the response, after it as the stream's last event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from fastapi import Request, Response
from pydantic import BaseModel

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.protocol import RequestFailed, RequestRejected, ServingEngine
from pagoda_runtime.engine.sampling_params import MODEL_DEFAULTED_FIELDS, SamplingParams
from pagoda_runtime.engine.structured_outputs import StructuredOutputs
from pagoda_runtime.server import sse
from pagoda_runtime.server.admission import QUEUE_FULL_RETRY_AFTER_S
from pagoda_runtime.server.errors import APIError, error_body
from pagoda_runtime.server.protocol import SamplingFields, Truncation, UsageInfo
from pagoda_runtime.server.state import ServerState

T = TypeVar("T")
# What nginx logs for a client that closed the connection; nobody receives it.
CLIENT_CLOSED = 499


class Disconnected(Exception):
    """The client closed the connection before the response was ready."""


def usage(out: RequestOutput, answered: bool = True) -> UsageInfo:
    """answered False: the prompt alone was the answer (echo with max_tokens 0), no completion token."""
    prompt = len(out.prompt_token_ids)
    completion = sum(len(o.token_ids) for o in out.outputs) if answered else 0
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def truncated(ids: list[int], body: Truncation, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last N tokens (-1: `max_model_len`, what the
    context holds of a prompt), or its first N with truncation_side "right"."""
    if body.truncate_prompt_tokens is None:
        return ids
    keep = max_model_len if body.truncate_prompt_tokens == -1 else body.truncate_prompt_tokens
    return ids[:keep] if body.truncation_side == "right" else ids[-keep:]


def request_defaults(state: ServerState, engine: ServingEngine) -> Mapping[str, float]:
    """The sampling a request leaves out takes: the model's recommended (--generation-config auto)."""
    return engine.sampling_defaults if state.settings.generation_config == "auto" else {}


def sampling_params(
    body: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    constraint: StructuredOutputs | None,
    prompt_logprobs: int | None = None,
    defaults: Mapping[str, float] | None = None,
) -> SamplingParams:
    """max_tokens None: up to the context length. `constraint`: the body's own (server.constraints)
    or one the endpoint derived (tool_choice). `defaults`: request_defaults, for the knobs the body
    does not set."""
    knobs = {name: getattr(body, name) for name in MODEL_DEFAULTED_FIELDS}
    knobs |= {k: v for k, v in (defaults or {}).items() if k in knobs and k not in body.model_fields_set}
    try:
        return SamplingParams(
            n=body.n,
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            seed=body.seed,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            stop=body.stop_list(),
            stop_token_ids=body.stop_token_ids or [],
            include_stop_str_in_output=body.include_stop_str_in_output,
            skip_special_tokens=body.skip_special_tokens,
            logit_bias=body.logit_bias_by_id(),
            allowed_token_ids=body.allowed_token_ids,
            bad_words=body.bad_words,
            ignore_eos=body.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            structured_outputs=constraint,
            cache_salt=body.cache_salt,
            output_kind="delta",  # the endpoints read deltas, and the whole text from the final output
            **knobs,
        )
    except ValueError as exc:
        raise APIError(400, f"{exc}.") from exc


async def generate(
    state: ServerState,
    engine: ServingEngine,
    prompt_ids: list[int],
    params: SamplingParams | PoolingParams,
    request_id: str,
    fields: Mapping[str, str] | None = None,
    lora_name: str | None = None,
    priority: int = 0,
) -> AsyncIterator[RequestOutput]:
    """The engine's outputs for one request, observed for metrics; aborted if left unfinished.

    A request the engine rejects becomes a 400 naming the field at fault; `fields` renames the
    engine's field names ("prompt", "max_tokens") to the ones this endpoint's request used. Until
    its first output the request is queued, and a full queue may shed it for a more urgent one
    (shedding.py): then its answer is a 429 instead of that output.
    `lora_name`: the LoRA adapter the request's model names, None for the base model.
    """
    finished = refused = failed = False
    last_token_at = None
    generated = 0
    queued = True
    # Entered in the same turn of the event loop as engine.generate() queues the request, so that a
    # request the server may shed is always one the engine can abort.
    state.queued.enter(request_id, priority)
    try:
        async for out in engine.generate(
            prompt_ids, params, request_id, priority=priority, lora_name=lora_name
        ):
            if queued:
                queued = False
                if state.queued.leave(request_id):
                    refused = True
                    state.metrics.reject("shed")
                    raise APIError(
                        429,
                        "The request queue is full and this request was shed for a higher-priority one; "
                        "retry after a short wait.",
                        code="shed",
                        retry_after=QUEUE_FULL_RETRY_AFTER_S,
                    )
            now = time.monotonic()
            per_sample = [len(d.token_ids) for d in out.delta or ()]
            generated += sum(per_sample)
            new_tokens = max(per_sample, default=0)
            if new_tokens:
                state.health.saw_tokens()
                if last_token_at is not None:
                    state.metrics.token_gap(now - last_token_at, new_tokens)
                last_token_at = now
            if out.finished:
                finished = True
                allowed = 0 if isinstance(params, PoolingParams) else params.max_tokens
                allowed = allowed or engine.max_model_len - len(prompt_ids)
                state.metrics.finished(out, allowed, lora_name)
            yield out
    except RequestRejected as exc:
        refused = True
        param = (fields or {}).get(exc.param, exc.param)
        # An adapter unloaded between the request's arrival and the engine: as unknown as any model.
        status = 404 if exc.code == "model_not_found" else 400
        raise APIError(status, exc.message, param=param, code=exc.code) from exc
    except RequestFailed as exc:
        failed = True
        state.metrics.ended(generated, len(prompt_ids), "error")
        raise APIError(
            500,
            "The server hit an internal error while generating this request; retry it, and report it "
            "if it persists.",
            code="internal_error",
        ) from exc
    finally:
        state.queued.leave(request_id)
        if not (finished or refused or failed):
            await engine.abort(request_id)
            state.metrics.ended(generated, len(prompt_ids), "abort")


async def respond(
    request: Request,
    state: ServerState,
    outputs: AsyncIterator[RequestOutput],
    whole: Callable[[RequestOutput], BaseModel],
    stream: Callable[[AsyncIterator[RequestOutput]], AsyncIterator[bytes]] | None,
) -> BaseModel | Response:
    """The response for one admitted request: whole (stream is None) or as Server-Sent Events.

    The request counts as in flight for the drain until its last byte is produced.
    """
    in_flight = contextlib.ExitStack()
    in_flight.enter_context(state.drain.track())
    if stream is None:
        with in_flight:
            try:
                return whole(await unless_disconnected(request, _last(outputs)))
            except Disconnected:
                return Response(status_code=CLIENT_CLOSED)
    try:
        # Awaited before answering so that a request the engine refuses still gets a 400, not a 200 stream.
        first = await unless_disconnected(request, anext(outputs))
    except Disconnected:
        in_flight.close()
        return Response(status_code=CLIENT_CLOSED)
    except BaseException:
        in_flight.close()
        raise

    async def events():
        try:
            async for chunk in stream(_prepend(first, outputs)):
                yield chunk
        except APIError as error:
            # The status line went out with the first chunk: the error is the stream's last event.
            yield sse.event(error_body(error.status, error.message, error.param, error.code))
        yield sse.DONE

    async def close() -> None:
        await outputs.aclose()
        in_flight.close()

    return sse.EventStreamResponse(events(), on_close=close)


async def _last(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for out in outputs:
        final = out
    return final


async def _prepend(first: RequestOutput, rest: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    yield first
    async for out in rest:
        yield out


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs work, cancelling it (which aborts the engine request) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise Disconnected
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
