"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: vLLM's bodies, answers and errors, so that
the same clients and gateways change the served adapters live, without a restart.

`lora_path` is a folder or, as in --lora-modules, an hf:// or s3:// source downloaded first into
the download dir. Loading reads and checks the folder before the adapter is served (a bad folder or
source, an adapter that does not fit the model or a rank above --max-lora-rank is a 400 naming the
problem; a name already served is a 400); unloading a name not served is a 404. An adapter
unloaded while requests run with it is refused to new requests at once and freed when those finish.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from pagoda_runtime.engine.protocol import LoraAdapterError, LoraNotFound, ServingEngine
from pagoda_runtime.server.admission import LOADING_RETRY_AFTER_S
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.state import ServerState


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None  # vLLM's body carries it; the name alone decides


def _engine(state: ServerState) -> ServingEngine:
    if state.engine is None:
        message = "The model is still loading; retry shortly."
        raise APIError(503, message, code="not_ready", retry_after=LOADING_RETRY_AFTER_S)
    return state.engine


async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    state: ServerState = request.app.state.pagoda
    engine = _engine(state)
    if not body.lora_name or not body.lora_path:
        raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_name")
    if body.lora_name in state.settings.model_names:
        raise APIError(
            400,
            f"'{body.lora_name}' is the name of the base model; name the adapter otherwise.",
            param="lora_name",
        )
    try:
        await engine.add_lora(body.lora_name, body.lora_path)
    except LoraAdapterError as exc:
        raise APIError(400, str(exc), param="lora_path") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    state: ServerState = request.app.state.pagoda
    engine = _engine(state)
    try:
        await engine.remove_lora(body.lora_name)
    except LoraNotFound as exc:
        raise APIError(404, str(exc), param="lora_name", code="model_not_found") from exc
    except LoraAdapterError as exc:
        raise APIError(400, str(exc), param="lora_name") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
