"""Whether a request may enter the engine now: the model it names, drain, load, queue depth.

Refusals here are cheap and early, and each says what the client can do: 404 for a model this
server does not serve (a 307 to the gateway path of the sibling variant that serves it, when the
gateway said where that is), 503 with Retry-After while draining or loading, 429 with Retry-After
when the waiting queue is full. Under the priority policy a full queue still admits a request that
outranks a queued one, which is shed in its place (shedding.py). Whether the request itself fits
the model is the engine's to say (request_validation.py), and generation.py turns its refusal into
a 400.
"""

from __future__ import annotations

from fastapi import Request

from pagoda_runtime.contract.names import VARIANT_ROUTES_HEADER
from pagoda_runtime.contract.serve_settings import DEFAULT_QUEUE_BATCHES, ServerSettings
from pagoda_runtime.engine.protocol import ServingEngine
from pagoda_runtime.server.drain import RETRY_AFTER_S
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.state import ServerState

QUEUE_FULL_RETRY_AFTER_S = 1
LOADING_RETRY_AFTER_S = 5


def max_in_flight(settings: ServerSettings) -> int:
    """The hard bound on accepted, unfinished requests: a full batch plus the queue behind it."""
    queue = settings.max_queue
    if queue is None:
        queue = DEFAULT_QUEUE_BATCHES * settings.max_num_seqs
    return settings.max_num_seqs + queue


def variant_routes(header: str | None) -> dict[str, str]:
    """The gateway's VARIANT_ROUTES_HEADER: model name -> the path prefix that reaches it."""
    routes = {}
    for entry in (header or "").split(","):
        model, sep, path = entry.strip().partition("=")
        if sep and model and path.startswith("/"):
            routes[model] = path.rstrip("/")
    return routes


def check_model(state: ServerState, model: str | None, request: Request | None = None) -> str | None:
    """The LoRA adapter `model` names, None for the base model; 404 for a model not served here, or
    a 307 to a sibling variant's gateway path (`request`'s VARIANT_ROUTES_HEADER) that serves it."""
    served = state.settings.model_names
    if model is None or model in served:
        return None
    adapters = state.engine.lora_adapters() if state.engine is not None else {}
    if model in adapters:
        return model
    routes = variant_routes(request.headers.get(VARIANT_ROUTES_HEADER)) if request is not None else {}
    if path := routes.get(model):
        target = path + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        # 307 keeps the method and the body; the OpenAI clients follow it.
        raise APIError(
            307,
            f"The model '{model}' is served by another variant of this service, at {path}.",
            param="model",
            code="model_elsewhere",
            location=target,
        )
    names = ", ".join(repr(n) for n in (*served, *adapters))
    raise APIError(
        404,
        f"The model '{model}' does not exist; this server serves {names}.",
        param="model",
        code="model_not_found",
    )


async def admit(state: ServerState, priority: int = 0) -> ServingEngine:
    """The engine, if this request (of `priority`) may enter it now; otherwise 503 (draining,
    loading) or 429 (queue full)."""
    if state.drain.draining:
        state.drain.refused += 1
        state.metrics.reject("draining")
        raise APIError(
            503,
            "The server is shutting down; retry on another replica.",
            code="draining",
            retry_after=RETRY_AFTER_S,
        )
    engine = state.engine
    if engine is None or engine.errored is not None:
        state.metrics.reject("not_ready")
        message = "The model is still loading; retry shortly." if engine is None else "The engine has failed."
        raise APIError(503, message, code="not_ready", retry_after=LOADING_RETRY_AFTER_S)
    # The server's own count of accepted requests, not the engine's: requests that arrived during
    # an engine step are not in the engine yet, and a burst must not slip through that gap. Shed
    # requests count until their 429 is out, but their places are taken already.
    if state.drain.in_flight - state.queued.num_shed >= max_in_flight(state.settings):
        victim = state.queued.shed_for(priority) if engine.scheduling_policy == "priority" else None
        if victim is not None:
            await engine.abort(victim)  # its own generate() answers its client (generation.py)
            return engine
        state.metrics.reject("queue_full")
        waiting = state.drain.in_flight - state.settings.max_num_seqs
        raise APIError(
            429,
            f"The request queue is full ({waiting} waiting); retry after a short wait.",
            code="queue_full",
            retry_after=QUEUE_FULL_RETRY_AFTER_S,
        )
    return engine
