"""POST /classify as vLLM serves it: each input's class probabilities from a sequence classifier
(contract/pooling.Classifier), with the likeliest label's name. Other engines answer 400."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from pydantic import BaseModel

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.generation import generate, respond
from pagoda_runtime.server.merged_outputs import finals
from pagoda_runtime.server.pooled_inputs import PooledInputRequest
from pagoda_runtime.server.protocol import UsageInfo


class ClassificationRequest(PooledInputRequest):
    """vLLM's: the inputs to classify, as /v1/embeddings takes them."""


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
    inputs = body.inputs("classify")
    engine = await admit(state)
    prompts = body.prompts(inputs, engine)
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
