"""POST /v1/chat/completions: messages (and tools) through the model's chat template, answered
whole or streamed; tool calls found by the server's tool-call parser or forced by tool_choice
(chat_turn.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.server import sse
from pagoda_runtime.server.chat_turn import prepare_chat
from pagoda_runtime.server.generation import respond, usage
from pagoda_runtime.server.logprobs import chat_logprobs, prompt_logprobs
from pagoda_runtime.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
)


async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    turn = await prepare_chat(body, request)
    ids, tokenizer = turn.ids, turn.engine.tokenizer
    returned_ids = body.return_token_ids
    last = body.messages[-1]
    replying_as = "assistant" if body.add_generation_prompt else last.role
    echoed = last.text() if body.echo and last.role == replying_as else ""
    top_n = body.top_logprobs or 0
    as_ids = body.tokens_as_ids(turn.state.settings)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or turn.state.settings.served_model_name
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    def logprobs(token_ids, token_logprobs):
        if not body.logprobs:
            return None
        return chat_logprobs(tokenizer, token_ids, token_logprobs, top_n, as_ids)

    def whole(final: RequestOutput) -> ChatCompletionResponse:
        choices = []
        for o in sorted(final.outputs, key=lambda o: o.index):
            reply = turn.message(o.text)
            if echoed:
                reply.content = echoed + (reply.content or "")
            choices.append(
                ChatChoice(
                    index=o.index,
                    message=reply,
                    logprobs=logprobs(o.token_ids, o.logprobs),
                    finish_reason=turn.finish_reason(o.finish_reason, bool(reply.tool_calls)),
                    token_ids=o.token_ids if returned_ids else None,
                )
            )
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=choices,
            usage=usage(final),
            prompt_logprobs=prompt_logprobs(tokenizer, final, body.prompt_logprobs),
            prompt_token_ids=ids if returned_ids else None,
        )

    def chunk(choices: list[ChatChunkChoice], **extra) -> bytes:
        message = ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices, **extra)
        return sse.event(message, exclude=None if include_usage else {"usage"})

    async def stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        yield chunk(
            [
                ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                for i in range(body.n)
            ],
            prompt_token_ids=ids if returned_ids else None,
        )
        if echoed:
            yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(content=echoed)) for i in range(body.n)])
        texts = [""] * body.n
        sent = [0] * body.n  # of each choice's content, where no tool-call parser reads it
        tool_streams = [turn.tool_stream() for _ in range(body.n)]
        reasoning_streams = [turn.reasoning_stream() for _ in range(body.n)]
        out = None
        async for out in outputs:
            choices = []
            for delta in out.delta or ():
                i, final = delta.index, delta.finish_reason is not None
                texts[i] += delta.text
                visible, thought = texts[i], None
                if (reasoning := reasoning_streams[i]) is not None:
                    thought = reasoning.feed(texts[i], final)
                    thought = thought if body.include_reasoning else None
                    visible = reasoning.content
                content, calls = visible[sent[i] :], None
                sent[i] = max(sent[i], len(visible))
                tools = tool_streams[i]
                if tools is not None:
                    content, calls = tools.feed(visible, final)
                if content or calls or thought or delta.token_ids or delta.finish_reason:
                    called = tools is not None and tools.called
                    message = DeltaMessage(
                        content=content or None,
                        tool_calls=calls or None,
                        reasoning_content=thought or None,
                        reasoning=thought or None,
                    )
                    choices.append(
                        ChatChunkChoice(
                            index=delta.index,
                            delta=message,
                            logprobs=logprobs(delta.token_ids, delta.logprobs) if delta.token_ids else None,
                            finish_reason=turn.finish_reason(delta.finish_reason, called),
                            token_ids=delta.token_ids if returned_ids else None,
                        )
                    )
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], usage=usage(out))

    outputs = turn.outputs(request_id)
    return await respond(request, turn.state, outputs, whole, stream if body.stream else None)
