"""Every field this server accepts or returns, checked against the official openai client's own
types: request fields are OpenAI's (or a vLLM extension listed here), responses validate as
openai's pydantic models (strictly, not the client's lenient construct)."""

from __future__ import annotations

import json

import pytest
from openai.types import completion_create_params
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionToolMessageParam,
)
from openai.types.chat import (
    completion_create_params as chat_create_params,
)
from openai.types.shared_params import FunctionDefinition as OpenAIFunctionDefinition
from openai.types.shared_params import ResponseFormatJSONSchema
from openai.types.shared_params.response_format_json_schema import JSONSchema
from pagoda_runtime.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    JSONSchemaFormat,
    ResponseFormat,
)
from pagoda_runtime.server.tools import FunctionDefinition, NamedToolChoice, ToolCall, ToolDefinition

from .test_tools_api import CALL, END, WEATHER

# vLLM's sampling, scheduling and structured-output extensions, which OpenAI's API does not have.
VLLM_EXTENSIONS = {
    "priority",
    "cache_salt",
    "prompt_logprobs",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "chat_template",
    "documents",
    "truncation_side",
    "allowed_token_ids",
    "skip_special_tokens",
    "return_token_ids",
    "return_tokens_as_token_ids",
    "include_reasoning",
    "bad_words",
    "truncate_prompt_tokens",
    "add_special_tokens",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
}


def keys(*typed_dicts) -> set[str]:
    return {key for t in typed_dicts for key in t.__required_keys__ | t.__optional_keys__}


def fields(model) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


@pytest.mark.parametrize(
    ("ours", "theirs", "extensions"),
    [
        # vLLM's chat has an echo of its own (the last message's text before the reply).
        (
            ChatCompletionRequest,
            chat_create_params.CompletionCreateParamsStreaming,
            VLLM_EXTENSIONS | {"echo"},
        ),
        # vLLM accepts response_format on completions too.
        (
            CompletionRequest,
            completion_create_params.CompletionCreateParamsStreaming,
            VLLM_EXTENSIONS | {"response_format"},
        ),
        (ResponseFormat, ResponseFormatJSONSchema, set()),
        (JSONSchemaFormat, JSONSchema, set()),
        (ToolDefinition, ChatCompletionFunctionToolParam, set()),
        (FunctionDefinition, OpenAIFunctionDefinition, set()),
        (NamedToolChoice, ChatCompletionNamedToolChoiceParam, set()),
        (ToolCall, ChatCompletionMessageFunctionToolCallParam, set()),
    ],
)
def test_request_fields_are_openais_or_named_extensions(ours, theirs, extensions):
    unknown = fields(ours) - keys(theirs) - extensions
    assert not unknown, f"{ours.__name__} has fields the openai client's {theirs.__name__} lacks: {unknown}"


def test_chat_message_fields_are_those_of_openais_messages():
    assert {"tool_call_id", "content", "role"} <= keys(ChatCompletionToolMessageParam)
    assert fields(ChatMessage) - {"role", "content", "name", "tool_calls", "tool_call_id"} == set()


def test_responses_with_tool_calls_validate_as_openais_models(fake):
    client, engine = fake
    engine.script = "Sure. " + CALL + END
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [WEATHER],
        "max_tokens": 200,
        "stop": [END],
    }
    whole = ChatCompletion.model_validate(client.post("/v1/chat/completions", json=body).json())
    assert whole.choices[0].message.tool_calls[0].function.name == "get_weather"
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: {")]
    chunks = [ChatCompletionChunk.model_validate(json.loads(line)) for line in lines]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    structured = {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}
    ChatCompletion.model_validate(
        client.post("/v1/chat/completions", json={**structured, "max_tokens": 2}).json()
    )
