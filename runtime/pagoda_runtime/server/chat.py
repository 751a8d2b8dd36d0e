"""POST /v1/chat/completions: messages (and tools) through the model's chat template, answered
whole or streamed; tool calls found by the server's tool-call parser or forced by tool_choice."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from pagoda_runtime.engine.chat_prompt import ChatPromptError
from pagoda_runtime.engine.chat_prompt import chat_prompt_ids as render_chat
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.protocol import ChatTokenizer
from pagoda_runtime.server import sse
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.constraints import structured_outputs
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond, sampling_params, truncated, usage
from pagoda_runtime.server.logprobs import chat_logprobs, prompt_logprobs
from pagoda_runtime.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatTemplateOptions,
    DeltaMessage,
)
from pagoda_runtime.server.state import ServerState
from pagoda_runtime.server.tool_parsers import (
    NamedCallStream,
    RequiredArrayParser,
    ToolCallStream,
    parse_whole,
    parser_named,
)
from pagoda_runtime.server.tools import (
    FunctionCall,
    NamedToolChoice,
    ToolCall,
    ToolDefinition,
    template_tools,
    tool_choice_constraint,
)


def chat_prompt_ids(
    messages: list[ChatMessage],
    tools: list[ToolDefinition] | None,
    options: ChatTemplateOptions,
    tokenizer: ChatTokenizer,
) -> list[int]:
    """The messages (and tools) through the chat template, with a body's template options."""
    try:
        return render_chat(
            tokenizer,
            [m.for_template() for m in messages],
            tools=template_tools(tools) if tools else None,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            template_kwargs=options.chat_template_kwargs,
            documents=options.documents,
            reasoning_effort=options.reasoning_effort,
        )
    except ChatPromptError as exc:
        raise APIError(400, f"{exc}.", param=exc.param) from exc


async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    lora_name = check_model(state, body.model, request)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true.", param="top_logprobs")
    choice = body.tool_choice
    forced = tool_choice_constraint(body.tools, choice, body.parallel_tool_calls)
    constraint = structured_outputs(body)
    if forced is not None and constraint is not None:
        raise APIError(
            400,
            "tool_choice required or a named function already fixes the output; drop the other constraint.",
            param="tool_choice",
        )
    engine = await admit(state, body.priority)
    ids = chat_prompt_ids(body.messages, body.tools, body, engine.tokenizer)
    ids = truncated(ids, body, engine.max_model_len)
    returned_ids = body.return_token_ids
    last = body.messages[-1]
    replying_as = "assistant" if body.add_generation_prompt else last.role
    echoed = last.text() if body.echo and last.role == replying_as else ""
    limit_field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    top_n = body.top_logprobs or 0
    params = sampling_params(
        body,
        body.completion_token_limit(),
        top_n if body.logprobs else None,
        forced or constraint,
        body.prompt_logprobs,
    )
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    parser = None
    if choice == "required":
        parser = RequiredArrayParser()
    elif body.tools and choice in (None, "auto"):
        parser = parser_named(state.settings.tool_call_parser)

    def logprobs(token_ids, token_logprobs):
        return chat_logprobs(engine.tokenizer, token_ids, token_logprobs, top_n) if body.logprobs else None

    def message(text: str) -> AssistantMessage:
        if named is not None:
            return AssistantMessage(
                content=None, tool_calls=[ToolCall(function=FunctionCall(name=named, arguments=text))]
            )
        if parser is None:
            return AssistantMessage(content=text)
        content, calls = parse_whole(parser, text)
        return AssistantMessage(content=content, tool_calls=[ToolCall(function=c) for c in calls] or None)

    def finish_reason(reason: str | None, called: bool) -> str | None:
        # OpenAI answers a named tool_choice with "stop"; a call the model chose ends in "tool_calls".
        return "tool_calls" if reason == "stop" and called and named is None else reason

    def whole(final: RequestOutput) -> ChatCompletionResponse:
        choices = []
        for o in sorted(final.outputs, key=lambda o: o.index):
            reply = message(o.text)
            if echoed:
                reply.content = echoed + (reply.content or "")
            choices.append(
                ChatChoice(
                    index=o.index,
                    message=reply,
                    logprobs=logprobs(o.token_ids, o.logprobs),
                    finish_reason=finish_reason(o.finish_reason, bool(reply.tool_calls)),
                    token_ids=o.token_ids if returned_ids else None,
                )
            )
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=choices,
            usage=usage(final),
            prompt_logprobs=prompt_logprobs(engine.tokenizer, final, body.prompt_logprobs),
            prompt_token_ids=ids if returned_ids else None,
        )

    def chunk(choices: list[ChatChunkChoice], **extra) -> bytes:
        message = ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices, **extra)
        return sse.event(message, exclude=None if include_usage else {"usage"})

    def tool_stream():
        if named is not None:
            return NamedCallStream(named)
        return ToolCallStream(parser) if parser is not None else None

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
        tool_streams = [tool_stream() for _ in range(body.n)]
        out = None
        async for out in outputs:
            choices = []
            for delta in out.delta or ():
                texts[delta.index] += delta.text
                content, calls = delta.text, None
                tools = tool_streams[delta.index]
                if tools is not None:
                    content, calls = tools.feed(texts[delta.index], delta.finish_reason is not None)
                if content or calls or delta.token_ids or delta.finish_reason:
                    called = tools is not None and tools.called
                    choices.append(
                        ChatChunkChoice(
                            index=delta.index,
                            delta=DeltaMessage(content=content or None, tool_calls=calls or None),
                            logprobs=logprobs(delta.token_ids, delta.logprobs) if delta.token_ids else None,
                            finish_reason=finish_reason(delta.finish_reason, called),
                            token_ids=delta.token_ids if returned_ids else None,
                        )
                    )
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], usage=usage(out))

    fields = {"prompt": "messages", "max_tokens": limit_field}
    outputs = generate(
        state, engine, ids, params, request_id, fields, lora_name=lora_name, priority=body.priority
    )
    return await respond(request, state, outputs, whole, stream if body.stream else None)
