"""POST /v1/chat/completions: messages through the model's chat template, answered whole or streamed."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import jinja2
from fastapi import Request

from pagoda_runtime.outputs import RequestOutput
from pagoda_runtime.server import sse
from pagoda_runtime.server.admission import admit, check_model, completion_budget
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond, sampling_params, usage
from pagoda_runtime.server.logprobs import chat_logprobs
from pagoda_runtime.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    DeltaMessage,
)
from pagoda_runtime.server.state import ServerState


def chat_prompt_ids(messages: list[ChatMessage], tokenizer) -> list[int]:
    # "developer" is OpenAI's newer name for the system role; chat templates only know "system".
    plain = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
    try:
        text = tokenizer.apply_chat_template(plain, add_generation_prompt=True)
    except (ValueError, jinja2.TemplateError) as exc:
        # No template, or the template itself rejects the conversation (e.g. roles must alternate).
        raise APIError(
            400, f"The messages cannot be rendered with the model's chat template: {exc}.", param="messages"
        ) from exc
    # The template already writes the special tokens (BOS included) where the model expects them.
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise APIError(400, "The messages render to an empty prompt; send some content.", param="messages")
    return ids


async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    check_model(state, body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true.", param="top_logprobs")
    engine = admit(state)
    ids = chat_prompt_ids(body.messages, engine.tokenizer)
    field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = completion_budget(
        len(ids), body.completion_token_limit(), engine.max_model_len, field, "messages"
    )
    top_n = body.top_logprobs or 0
    params = sampling_params(body, max_tokens, top_n if body.logprobs else None)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = state.settings.served_model_name
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    def logprobs(token_ids, token_logprobs):
        return chat_logprobs(engine.tokenizer, token_ids, token_logprobs, top_n) if body.logprobs else None

    def whole(final: RequestOutput) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                index=o.index,
                message=AssistantMessage(content=o.text),
                logprobs=logprobs(o.token_ids, o.logprobs),
                finish_reason=o.finish_reason,
            )
            for o in sorted(final.outputs, key=lambda o: o.index)
        ]
        return ChatCompletionResponse(
            id=request_id, created=created, model=model, choices=choices, usage=usage(final)
        )

    def chunk(choices: list[ChatChunkChoice], **extra) -> bytes:
        message = ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices, **extra)
        return sse.event(message, exclude=None if include_usage else {"usage"})

    async def stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        yield chunk(
            [
                ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                for i in range(body.n)
            ]
        )
        out = None
        async for out in outputs:
            choices = [
                ChatChunkChoice(
                    index=delta.index,
                    delta=DeltaMessage(content=delta.text or None),
                    logprobs=logprobs(delta.token_ids, delta.logprobs) if delta.token_ids else None,
                    finish_reason=delta.finish_reason,
                )
                for delta in out.delta or ()
                if delta.text or delta.token_ids or delta.finish_reason
            ]
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], usage=usage(out))

    outputs = generate(state, engine, ids, params, request_id)
    return await respond(request, state, outputs, whole, stream if body.stream else None)
