"""A chat request made ready to generate: its messages through the chat template, its sampling
parameters, and the rules that read its reply (tool calls the server's parser finds, or the call a
named tool_choice forces). The chat endpoint (chat.py) and the Responses API (responses.py) each
answer it in their own shapes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from fastapi import Request

from pagoda_runtime.engine.chat_prompt import ChatPromptError
from pagoda_runtime.engine.chat_prompt import chat_prompt_ids as render_chat
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.protocol import ChatTokenizer, ServingEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.constraints import structured_outputs
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, request_defaults, sampling_params, truncated
from pagoda_runtime.server.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatMessage,
    ChatTemplateOptions,
)
from pagoda_runtime.server.reasoning import HARMONY_PARSER, ReasoningStream, Split, reply_split
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
    call_id,
    template_tools,
    tool_choice_constraint,
)

# Enough of the prompt's end to find a think block the chat template opened for the reply.
_PROMPT_TAIL_TOKENS = 16


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


@dataclass
class ChatTurn:
    state: ServerState
    body: ChatCompletionRequest
    engine: ServingEngine
    lora_name: str | None
    ids: list[int]
    params: SamplingParams
    named: str | None  # the function a named tool_choice forces the reply to call
    parser: object | None  # finds the tool calls in a reply the model wrote (tool_parsers.py)
    fields: dict[str, str]  # the engine's field names -> this request's, for its errors
    # With --reasoning-parser and a reply no grammar fixes: how its reasoning is told from its
    # content (reasoning.py); None: the reply has no reasoning to tell apart.
    split: Split | None = None

    def message(self, text: str) -> AssistantMessage:
        """The whole reply: its reasoning apart, then its text or the tool calls in it."""
        reasoning = None
        if self.split is not None:
            reasoning, text = self.split(text, True)
            reasoning = (reasoning or None) if self.body.include_reasoning else None
        if self.named is not None:
            return AssistantMessage(
                content=None, tool_calls=[ToolCall(function=FunctionCall(name=self.named, arguments=text))]
            )
        content, calls = (text, []) if self.parser is None else parse_whole(self.parser, text)
        if self.split is not None and not content:
            content = None  # a reply cut off while thinking has no answer
        return AssistantMessage(
            content=content,
            tool_calls=[ToolCall(id=call_id(c), function=c) for c in calls] or None,
            reasoning_content=reasoning,
            reasoning=reasoning,
        )

    def reasoning_stream(self) -> ReasoningStream | None:
        """A reader of the reply as it streams that tells its reasoning from its content."""
        return None if self.split is None else ReasoningStream(self.split)

    def tool_stream(self) -> ToolCallStream | NamedCallStream | None:
        """A reader of the reply as it streams that tells its text from its tool calls."""
        if self.named is not None:
            return NamedCallStream(self.named)
        return ToolCallStream(self.parser) if self.parser is not None else None

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        # OpenAI answers a named tool_choice with "stop"; a call the model chose ends in "tool_calls".
        return "tool_calls" if reason == "stop" and called and self.named is None else reason

    def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        return generate(
            self.state,
            self.engine,
            self.ids,
            self.params,
            request_id,
            self.fields,
            lora_name=self.lora_name,
            priority=self.body.priority,
        )


async def prepare_chat(body: ChatCompletionRequest, request: Request) -> ChatTurn:
    """Checks and admits the request (the cheap refusals first), then renders its prompt."""
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
    auto = bool(body.tools) and choice in (None, "auto")
    if auto and not state.settings.enable_auto_tool_choice:
        raise APIError(
            400,
            'tool_choice "auto" needs a server started without --no-enable-auto-tool-choice; send '
            'tool_choice "none", "required" or a named function',
            param="tool_choice",
        )
    engine = await admit(state, body.priority)
    ids = chat_prompt_ids(body.messages, body.tools, body, engine.tokenizer)
    ids = truncated(ids, body, engine.max_model_len)
    top_n = body.top_logprobs or 0
    params = sampling_params(
        body,
        body.completion_token_limit(),
        top_n if body.logprobs else None,
        forced or constraint,
        body.prompt_logprobs,
        request_defaults(state, engine),
    )
    parser = None
    if choice == "required":
        parser = RequiredArrayParser()
    elif auto:
        parser = parser_named(
            state.settings.tool_parser, {t.function.name: t.function.parameters or {} for t in body.tools}
        )
        if not engine.tokenizer.special_tokens.isdisjoint(parser.MARKERS):
            # The model's tool-call markup is made of special tokens here (GLM-4.5's <tool_call>).
            params = replace(params, skip_special_tokens=False)
    limit_field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    split = None
    reasoning_parser = state.settings.reasoning_parser
    if reasoning_parser is not None and params.structured_outputs is None:
        tail = engine.tokenizer.decode(ids[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        split = reply_split(reasoning_parser, tail)
        if reasoning_parser == HARMONY_PARSER:
            # Harmony's channels are told apart by its special tokens, so they stay in the text.
            params = replace(params, skip_special_tokens=False)
    return ChatTurn(
        state=state,
        body=body,
        engine=engine,
        lora_name=lora_name,
        ids=ids,
        params=params,
        named=choice.function.name if isinstance(choice, NamedToolChoice) else None,
        parser=parser,
        fields={"prompt": "messages", "max_tokens": limit_field},
        split=split,
    )
