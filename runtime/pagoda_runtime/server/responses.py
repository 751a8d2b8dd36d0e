"""POST /v1/responses: OpenAI's Responses API, answered through the chat turn (chat_turn.py) whole
or as its stream of typed events: response.created and .in_progress, then the message's item, part
and text deltas as the text comes, then each function call's item and arguments, and last
response.completed (.incomplete when max_output_tokens ended it, .failed when the server stopped
it), every event numbered."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import Request
from pydantic import ValidationError

from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.server import sse
from pagoda_runtime.server.chat_turn import prepare_chat
from pagoda_runtime.server.errors import APIError, validation_message
from pagoda_runtime.server.generation import respond
from pagoda_runtime.server.responses_protocol import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    StreamEvent,
)

# The engine's finish reasons that leave a response unfinished: its token limit, or a server that
# stopped it (draining past its timeout).
_UNFINISHED = ("length", "abort")
_STOPPED = ResponseError(
    code="server_error",
    message="The server stopped this response before it finished (it was shutting down); retry it.",
)


async def create_response(body: ResponsesRequest, request: Request):
    try:
        chat = body.as_chat()
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from exc
    # The engine's refusals name this API's fields, not the chat request's.
    turn = replace(
        await prepare_chat(chat, request), fields={"prompt": "input", "max_tokens": "max_output_tokens"}
    )
    response_id = f"resp_{uuid.uuid4().hex}"
    message_id = f"msg_{uuid.uuid4().hex}"
    model = body.model or turn.state.settings.served_model_name
    created = time.time()

    def response(status: str, **fields) -> ResponseObject:
        return ResponseObject(
            id=response_id,
            created_at=created,
            status=status,
            model=model,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            tools=body.tools,
            tool_choice=body.tool_choice,
            parallel_tool_calls=body.parallel_tool_calls,
            text=body.text,
            metadata=body.metadata or {},
            user=body.user,
            **fields,
        )

    def message(text: str, status: str) -> OutputMessage:
        return OutputMessage(id=message_id, status=status, content=[OutputText(text=text)])

    def calls(text: str) -> list[OutputFunctionCall]:
        return [
            OutputFunctionCall(
                id=f"fc_{uuid.uuid4().hex}",
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
            for call in turn.message(text).tool_calls or ()
        ]

    def finished(final: RequestOutput, output: list) -> ResponseObject:
        sample = final.outputs[0]
        prompt, generated = len(final.prompt_token_ids), len(sample.token_ids)
        usage = ResponseUsage(
            input_tokens=prompt,
            input_tokens_details=InputTokensDetails(cached_tokens=final.num_cached_tokens),
            output_tokens=generated,
            total_tokens=prompt + generated,
        )
        if sample.finish_reason == "abort":
            return response("failed", error=_STOPPED, output=output, usage=usage)
        if sample.finish_reason == "length":
            details = IncompleteDetails(reason="max_output_tokens")
            return response("incomplete", incomplete_details=details, output=output, usage=usage)
        return response("completed", output=output, usage=usage)

    def item_status(final: RequestOutput) -> str:
        return "incomplete" if final.outputs[0].finish_reason in _UNFINISHED else "completed"

    def whole(final: RequestOutput) -> ResponseObject:
        text = final.outputs[0].text
        content = turn.message(text).content
        return finished(final, ([message(content, item_status(final))] if content else []) + calls(text))

    async def stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        numbers = itertools.count()

        def event(kind: str, **fields) -> bytes:
            return sse.event(StreamEvent(type=kind, sequence_number=next(numbers), **fields))

        yield event("response.created", response=response("in_progress"))
        yield event("response.in_progress", response=response("in_progress"))
        reader = turn.tool_stream()
        text, shown, final = "", "", None
        where = {"item_id": message_id, "output_index": 0, "content_index": 0}
        async for final in outputs:
            for delta in final.delta or ():
                text += delta.text
                content = delta.text
                if reader is not None:
                    content, _ = reader.feed(text, delta.finish_reason is not None)
                if not content:
                    continue
                if not shown:
                    yield event("response.output_item.added", output_index=0, item=message("", "in_progress"))
                    yield event("response.content_part.added", part=OutputText(text=""), **where)
                shown += content
                yield event("response.output_text.delta", delta=content, logprobs=[], **where)
        output: list = []
        if shown:
            done = message(shown, item_status(final))
            yield event("response.output_text.done", text=shown, logprobs=[], **where)
            yield event("response.content_part.done", part=done.content[0], **where)
            yield event("response.output_item.done", output_index=0, item=done)
            output.append(done)
        for call in calls(text):
            index, started = len(output), call.model_copy(update={"status": "in_progress", "arguments": ""})
            yield event("response.output_item.added", output_index=index, item=started)
            argued = {"item_id": call.id, "output_index": index}
            yield event("response.function_call_arguments.delta", delta=call.arguments, **argued)
            yield event("response.function_call_arguments.done", arguments=call.arguments, **argued)
            yield event("response.output_item.done", output_index=index, item=call)
            output.append(call)
        ended = finished(final, output)
        yield event(f"response.{ended.status}", response=ended)

    outputs = turn.outputs(response_id)
    return await respond(request, turn.state, outputs, whole, stream if body.stream else None)
