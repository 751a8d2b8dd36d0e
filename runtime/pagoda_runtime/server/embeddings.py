"""POST /v1/embeddings, as OpenAI and vLLM serve it: a text (or token ids), or a list of them, in;
one vector each out, as floats or as base64 of little-endian float32 (the OpenAI client's default),
cut to `dimensions` where the model is a Matryoshka one (contract/pooling.py).
Served by an engine started with --runner pooling (contract/pooling.py); another engine answers 400."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, field_validator

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond
from pagoda_runtime.server.merged_outputs import finals
from pagoda_runtime.server.protocol import MAX_COMPLETIONS, TokenId, UsageInfo, ValidText, token_ids_in_range
from pagoda_runtime.server.state import ServerState


class EmbeddingRequest(ValidText):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None  # OpenAI's end-user id, for their abuse monitoring: nothing to do here
    add_special_tokens: bool = True  # vLLM's: BOS and the like, as the tokenizer adds them

    @field_validator("input", mode="before")
    @classmethod
    def _token_ids_in_range(cls, value: Any) -> Any:
        return token_ids_in_range(value)

    def inputs(self) -> list[str | list[int]]:
        """The one input or each of the listed ones (a list of ints is one input of token ids)."""
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            return [self.input]
        return list(self.input)


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
    inputs = body.inputs()
    if len(inputs) > MAX_COMPLETIONS:
        raise APIError(
            400,
            f"input lists {len(inputs)} inputs, more than the {MAX_COMPLETIONS} one request may embed; "
            "split them over several requests.",
            param="input",
        )
    if not inputs:
        raise APIError(
            400, "input is an empty list; give at least one text or list of token ids.", param="input"
        )
    engine = await admit(state)
    tokenizer = engine.tokenizer
    prompts = [
        tokenizer.encode(text, body.add_special_tokens) if isinstance(text, str) else list(text)
        for text in inputs
    ]
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
