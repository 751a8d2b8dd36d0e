"""POST /v1/responses: OpenAI's Responses API, answered through the chat turn (chat_turn.py) whole
or as its stream of typed events: response.created and .in_progress, then the message's item, part
and text deltas as the text comes, then each function call's item and arguments, and last
response.completed (.incomplete when max_output_tokens ended it, .failed when the server stopped
it), every event numbered."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
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
    OutputReasoning,
    OutputText,
    ReasoningText,
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
    reasoning_id = f"rs_{uuid.uuid4().hex}"
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
            temperature=turn.params.temperature,
            top_p=turn.params.top_p,
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

    def thought(text: str, status: str) -> OutputReasoning:
        return OutputReasoning(id=reasoning_id, content=[ReasoningText(text=text)], status=status)

    def whole(final: RequestOutput) -> ResponseObject:
        text = final.outputs[0].text
        reply = turn.message(text)
        status = item_status(final)
        output: list = [thought(reply.reasoning_content, status)] if reply.reasoning_content else []
        if reply.content:
            output.append(message(reply.content, status))
        return finished(final, output + calls(text))

    async def stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        numbers = itertools.count()

        def event(kind: str, **fields) -> bytes:
            return sse.event(StreamEvent(type=kind, sequence_number=next(numbers), **fields))

        yield event("response.created", response=response("in_progress"))
        yield event("response.in_progress", response=response("in_progress"))
        reader, thinker = turn.tool_stream(), turn.reasoning_stream()
        text, shown, thought_so_far, final = "", "", "", None
        output: list = []
        where = {"item_id": message_id, "content_index": 0}
        thinking = {"item_id": reasoning_id, "output_index": 0, "content_index": 0}

        def end_thought(status: str) -> Iterator[bytes]:
            done = thought(thought_so_far, status)
            yield event("response.reasoning_text.done", text=thought_so_far, **thinking)
            yield event("response.content_part.done", part=done.content[0], **thinking)
            yield event("response.output_item.done", output_index=0, item=done)
            output.append(done)

        async for final in outputs:
            for delta in final.delta or ():
                text += delta.text
                ended = delta.finish_reason is not None
                visible, piece = text, ""
                if thinker is not None:
                    piece, visible = thinker.feed(text, ended), thinker.content
                    piece = piece if turn.body.include_reasoning else ""
                if piece:
                    if not thought_so_far:
                        started = thought("", "in_progress")
                        yield event("response.output_item.added", output_index=0, item=started)
                        yield event("response.content_part.added", part=ReasoningText(text=""), **thinking)
                    thought_so_far += piece
                    yield event("response.reasoning_text.delta", delta=piece, **thinking)
                content = visible[len(shown) :]
                if reader is not None:
                    content, _ = reader.feed(visible, ended)
                if not content:
                    continue
                if thought_so_far and not output:
                    for chunk in end_thought("completed"):  # the answer began: the thinking is done
                        yield chunk
                at = {**where, "output_index": len(output)}
                if not shown:
                    added = message("", "in_progress")
                    yield event("response.output_item.added", output_index=len(output), item=added)
                    yield event("response.content_part.added", part=OutputText(text=""), **at)
                shown += content
                yield event("response.output_text.delta", delta=content, logprobs=[], **at)
        if thought_so_far and not output:
            for chunk in end_thought(item_status(final)):
                yield chunk
        if shown:
            done = message(shown, item_status(final))
            index = len(output)
            yield event("response.output_text.done", text=shown, logprobs=[], output_index=index, **where)
            yield event("response.content_part.done", part=done.content[0], output_index=index, **where)
            yield event("response.output_item.done", output_index=index, item=done)
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
