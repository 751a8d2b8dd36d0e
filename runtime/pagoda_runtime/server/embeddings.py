"""POST /v1/embeddings, as OpenAI and vLLM serve it: a text (or token ids), or a list of them, in;
one vector each out, as floats or as base64 of little-endian float32 (the OpenAI client's default),
cut to `dimensions` where the model is a Matryoshka one (contract/pooling.py).
Served by an engine started with --runner pooling (contract/pooling.py); another engine answers 400."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from typing import Literal

from fastapi import Request
from pydantic import BaseModel

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.generation import generate, respond
from pagoda_runtime.server.merged_outputs import finals
from pagoda_runtime.server.pooled_inputs import PooledInputRequest
from pagoda_runtime.server.protocol import UsageInfo
from pagoda_runtime.server.state import ServerState


class EmbeddingRequest(PooledInputRequest):
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


async def create_embedding(body: EmbeddingRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    lora_name = check_model(state, body.model, request)
    inputs = body.inputs("embed")
    engine = await admit(state)
    prompts = body.prompts(inputs, engine)
    request_id = f"embd-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name

    def whole(outputs: list[RequestOutput]) -> EmbeddingResponse:
        data = [
            EmbeddingData(index=i, embedding=_encoded(out.pooled, body.encoding_format))
            for i, out in enumerate(outputs)
        ]
        tokens = sum(len(out.prompt_token_ids) for out in outputs)
        usage = UsageInfo(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
        return EmbeddingResponse(id=request_id, created=created, model=model, data=data, usage=usage)

    params = PoolingParams(dimensions=body.dimensions)
    streams = [
        generate(state, engine, ids, params, f"{request_id}-{i}", {"prompt": "input"}, lora_name)
        for i, ids in enumerate(prompts)
    ]
    return await respond(request, state, finals(streams), whole, None)
