"""POST /classify as vLLM serves it: each input's class probabilities from a sequence classifier
(contract/pooling.Classifier), with the likeliest label's name. Other engines answer 400."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, field_validator

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond
from pagoda_runtime.server.merged_outputs import finals
from pagoda_runtime.server.protocol import MAX_COMPLETIONS, TokenId, UsageInfo, ValidText, token_ids_in_range


class ClassificationRequest(ValidText):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    user: str | None = None  # OpenAI's end-user id, for their abuse monitoring: nothing to do here

    @field_validator("input", mode="before")
    @classmethod
    def _token_ids_in_range(cls, value: Any) -> Any:
        return token_ids_in_range(value)

    def inputs(self) -> list[str | list[int]]:
        """The one input or each of the listed ones (a list of ints is one input of token ids)."""
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            return [self.input]
        return list(self.input)


class ClassificationData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


async def create_classify(body: ClassificationRequest, request: Request):
    state = request.app.state.pagoda
    lora_name = check_model(state, body.model, request)
    inputs = body.inputs()
    if not inputs or len(inputs) > MAX_COMPLETIONS:
        raise APIError(
            400,
            f"input lists {len(inputs)} inputs; one request classifies 1 to {MAX_COMPLETIONS} of them.",
            param="input",
        )
    engine = await admit(state)
    prompts = [engine.tokenizer.encode(text) if isinstance(text, str) else list(text) for text in inputs]
    request_id = f"classify-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name

    def whole(outputs: list[RequestOutput]) -> ClassificationResponse:
        labels = engine.class_labels
        data = [
            ClassificationData(
                index=i,
                label=labels[max(range(len(out.pooled)), key=out.pooled.__getitem__)],
                probs=out.pooled,
                num_classes=len(out.pooled),
            )
            for i, out in enumerate(outputs)
        ]
        tokens = sum(len(out.prompt_token_ids) for out in outputs)
        usage = UsageInfo(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
        return ClassificationResponse(id=request_id, created=created, model=model, data=data, usage=usage)

    params = PoolingParams(task="classify")
    streams = [
        generate(state, engine, ids, params, f"{request_id}-{i}", {"prompt": "input"}, lora_name)
        for i, ids in enumerate(prompts)
    ]
    return await respond(request, state, finals(streams), whole, None)
