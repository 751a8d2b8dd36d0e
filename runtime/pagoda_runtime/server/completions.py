"""POST /v1/completions: a text prompt (or token ids) in, n completions out, whole or streamed."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.protocol import ChatTokenizer
from pagoda_runtime.server import sse
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.constraints import structured_outputs
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond, sampling_params, usage
from pagoda_runtime.server.logprobs import completion_logprobs
from pagoda_runtime.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from pagoda_runtime.server.state import ServerState


def prompt_token_ids(
    prompt: str | list[int] | list[str] | list[list[int]], tokenizer: ChatTokenizer
) -> list[int]:
    """The one prompt's token ids; whether they fit the model is the engine's check."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(
                400,
                f"Batched prompts ({len(prompt)}) are not supported; send one request per prompt.",
                param="prompt",
            )
        prompt = prompt[0]
    return tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)


async def create_completion(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    lora_name = check_model(state, body.model, request)
    engine = await admit(state, body.priority)
    ids = prompt_token_ids(body.prompt, engine.tokenizer)
    params = sampling_params(body, body.max_tokens, body.logprobs, structured_outputs(body))
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    def logprobs(token_ids, token_logprobs, offset):
        if body.logprobs is None:
            return None
        return completion_logprobs(engine.tokenizer, token_ids, token_logprobs, body.logprobs, offset)

    def whole(final: RequestOutput) -> CompletionResponse:
        choices = [
            CompletionChoice(
                index=o.index,
                text=o.text,
                logprobs=logprobs(o.token_ids, o.logprobs, 0),
                finish_reason=o.finish_reason,
            )
            for o in sorted(final.outputs, key=lambda o: o.index)
        ]
        return CompletionResponse(
            id=request_id, created=created, model=model, choices=choices, usage=usage(final)
        )

    async def stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        offsets = [0] * body.n
        out = None
        async for out in outputs:
            choices = []
            for delta in out.delta or ():
                choices.append(
                    CompletionChoice(
                        index=delta.index,
                        text=delta.text,
                        logprobs=logprobs(delta.token_ids, delta.logprobs, offsets[delta.index]),
                        finish_reason=delta.finish_reason,
                    )
                )
                offsets[delta.index] += len(delta.text)
            if choices:
                chunk = CompletionResponse(id=request_id, created=created, model=model, choices=choices)
                yield sse.event(chunk, exclude=None if include_usage else {"usage"})
        if include_usage:
            yield sse.event(
                CompletionResponse(id=request_id, created=created, model=model, choices=[], usage=usage(out))
            )

    outputs = generate(state, engine, ids, params, request_id, priority=body.priority, lora_name=lora_name)
    return await respond(request, state, outputs, whole, stream if body.stream else None)
