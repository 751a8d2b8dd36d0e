"""The FastAPI application: routes, error handlers, the edge middleware, and background loading.

The model loads after the server starts listening, so that Kubernetes sees a live process with
a not-ready body (saying why) during a long load instead of connection refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pagoda_runtime.contract.names import LIVE_PATH, METRICS_PATH, READY_PATH
from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.engine.protocol import ServingEngine
from pagoda_runtime.loading.load_progress import LOAD_PROGRESS
from pagoda_runtime.server.admission import LOADING_RETRY_AFTER_S
from pagoda_runtime.server.chat import create_chat_completion
from pagoda_runtime.server.classify import create_classify
from pagoda_runtime.server.completions import create_completion
from pagoda_runtime.server.embeddings import create_embedding
from pagoda_runtime.server.errors import APIError, install_error_handlers
from pagoda_runtime.server.lora_routes import load_lora_adapter, unload_lora_adapter
from pagoda_runtime.server.metrics_compat import vllm_registry
from pagoda_runtime.server.middleware import EdgeMiddleware
from pagoda_runtime.server.protocol import ModelCard, ModelList
from pagoda_runtime.server.responses import create_response
from pagoda_runtime.server.scores import create_rerank, create_score
from pagoda_runtime.server.state import ServerState
from pagoda_runtime.server.tokenize import detokenize, tokenize

log = logging.getLogger("pagoda.server")

EngineLoader = Callable[[], Awaitable[ServingEngine]]


def build_app(
    settings: ServerSettings, load_engine: EngineLoader, on_fatal: Callable[[str], None] | None = None
) -> FastAPI:
    """The app; load_engine returns a started engine, on_fatal hears why it could not."""
    state = ServerState(settings)
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        background: list[asyncio.Task] = []
        background.append(asyncio.create_task(_load(state, load_engine, on_fatal, background)))
        yield
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if state.engine is not None:
            await state.engine.shutdown()

    app = FastAPI(title="Pagoda runtime", version="0.1.0", lifespan=lifespan)
    app.state.pagoda = state
    install_error_handlers(app)
    app.add_middleware(EdgeMiddleware, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes)
    if settings.allowed_origins:
        # Outside the edge, so that a browser's preflight (which carries no API key) is answered.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=list(settings.allowed_methods),
            allow_headers=list(settings.allowed_headers),
            allow_credentials=settings.allow_credentials,
        )
    app.add_api_route("/v1/completions", create_completion, methods=["POST"])
    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
    app.add_api_route("/v1/responses", create_response, methods=["POST"])
    app.add_api_route("/v1/embeddings", create_embedding, methods=["POST"])
    for path in ("/score", "/v1/score"):
        app.add_api_route(path, create_score, methods=["POST"])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.add_api_route(path, create_rerank, methods=["POST"])
    app.add_api_route("/classify", create_classify, methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    app.add_api_route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"])
    app.add_api_route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"])
    compat = vllm_registry(state.metrics.registry) if settings.metrics_compat == "vllm" else None

    @app.get("/v1/models")
    async def models() -> ModelList:
        engine = state.engine
        max_len = engine.max_model_len if engine is not None else 0
        cards = [
            ModelCard(id=name, created=started, max_model_len=max_len, root=settings.model)
            for name in settings.model_names
        ]
        adapters = engine.lora_adapters() if engine is not None else {}
        cards += [
            ModelCard(
                id=name,
                created=started,
                max_model_len=max_len,
                root=adapter.root,
                parent=adapter.parent or settings.served_model_name,
            )
            for name, adapter in adapters.items()
        ]
        return ModelList(data=cards)

    @app.get("/version")
    async def server_version() -> JSONResponse:
        return JSONResponse({"version": _version()})

    @app.get("/health")
    async def health() -> Response:
        """vLLM's health check: 200 with an empty body while the engine can serve, else 503."""
        check = state.health.live(state.engine)
        if state.engine is None or not check.ok:
            detail = state.load_error or ("the model is loading" if state.engine is None else check.detail)
            return JSONResponse({"detail": detail}, status_code=503)
        return Response(status_code=200)

    @app.get("/v1/info")
    async def info() -> JSONResponse:
        """What the loaded model occupies (quantization, weight bytes beside sizing's, KV cache), and
        with speculative decoding on, its tallies and acceptance rate."""
        if state.engine is None:
            message = "The model is still loading; retry shortly."
            raise APIError(503, message, code="not_ready", retry_after=LOADING_RETRY_AFTER_S)
        body = {"served_model_name": settings.served_model_name, **state.engine.memory.to_json()}
        spec = state.engine.stats().spec_decode
        if spec is not None:
            body["speculative_decoding"] = {
                "num_drafts": spec.num_drafts,
                "num_draft_tokens": spec.num_draft_tokens,
                "num_accepted_tokens": spec.num_accepted_tokens,
                "accepted_per_position": list(spec.accepted_per_position),
                "acceptance_rate": spec.acceptance_rate,
            }
        return JSONResponse(body)

    @app.get(LIVE_PATH)
    async def live() -> JSONResponse:
        check = state.health.live(state.engine)
        return JSONResponse({"live": check.ok, "detail": check.detail}, status_code=200 if check.ok else 503)

    @app.get(READY_PATH)
    async def ready() -> JSONResponse:
        checks = state.health.ready(state.engine, state.load_error, state.drain.draining)
        ok = all(c.ok for c in checks.values())
        body = {"ready": ok, "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in checks.items()}}
        body["startup"] = _startup(state)
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get(METRICS_PATH)
    async def metrics() -> Response:
        body = generate_latest(state.metrics.registry)
        if compat is not None:
            body += generate_latest(compat)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


def _version() -> str:
    try:
        return version("pagoda")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _startup(state: ServerState) -> dict:
    """The start-up phase and, while weights load, how far (tensors, bytes, rate)."""
    if state.load_error is not None:
        return {"phase": "failed", "error": state.load_error}
    if state.engine is not None:
        return {"phase": "loaded"}
    return LOAD_PROGRESS.snapshot().to_json()


async def _load(
    state: ServerState,
    load_engine: EngineLoader,
    on_fatal: Callable[[str], None] | None,
    background: list[asyncio.Task],
) -> None:
    started = time.monotonic()
    try:
        engine = await load_engine()
    except Exception as exc:  # every start-up failure is reported alike, as one line
        state.load_error = " ".join(f"start-up failed: {exc}".split())
        log.error(state.load_error)
        if on_fatal is not None:
            on_fatal(state.load_error)
        return
    if state.settings.chat_template is not None:
        # Before the first request: the tokenizer compiles its template on first use.
        engine.tokenizer.chat_template = state.settings.chat_template
    state.metrics.engine_loaded(engine.max_model_len)
    state.engine = engine
    log.info("model loaded in %.1fs; max_model_len=%d", time.monotonic() - started, engine.max_model_len)
    background.append(asyncio.create_task(state.health.run_canaries(engine, lambda: state.drain.draining)))
