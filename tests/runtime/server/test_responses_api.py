"""OpenAI's Responses API over the fake engine, driven by the official client: responses and every
streamed event parse as the client's own types, the turn reaches the engine as the chat endpoint
renders it, function calls go out and come back as items, and what the server does not serve is a
400 naming the field."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from .conftest import MODEL
from .fake_engine import SCRIPT
from .test_api_fake_engine import sse_payloads

EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def sdk(fake):
    client, engine = fake
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client), engine


def test_a_response_is_the_chat_turn_answered_in_openais_shape(fake, sdk):
    oa, engine = sdk
    response = oa.responses.create(model=MODEL, instructions="Be brief.", input="hi", max_output_tokens=5)
    assert engine.tokenizer.decode(engine.seen_prompts[-1]) == "<system>Be brief.\n<user>hi\n<assistant>"
    assert response.output_text == SCRIPT[:5] and response.output[0].type == "message"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5 and response.usage.input_tokens == len(engine.seen_prompts[-1])
    assert (
        response.instructions == "Be brief." and response.max_output_tokens == 5 and response.store is False
    )
    raw = fake[0].post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 5}).json()
    Response.model_validate(raw)  # every field the client's type requires, with its type


def test_the_stream_is_openais_typed_events_adding_up_to_the_response(fake):
    client, _ = fake
    ask = {"model": MODEL, "input": [{"role": "user", "content": "hi"}], "max_output_tokens": 6}
    whole = client.post("/v1/responses", json=ask).json()
    with client.stream("POST", "/v1/responses", json=ask | {"stream": True}) as streamed:
        events = [EVENTS.validate_python(e) for e in sse_payloads(streamed)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == SCRIPT[:6]
    assert events[-1].response.output[0].content[0].text == whole["output"][0]["content"][0]["text"]


def test_function_calls_go_out_as_items_and_come_back_as_input(fake, sdk):
    client, engine = fake
    oa, _ = sdk
    forced = oa.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=4,
    )
    [call] = forced.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == SCRIPT[:4]
    with client.stream(
        "POST",
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "Weather in Paris?",
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 4,
            "stream": True,
        },
    ) as streamed:
        events = [EVENTS.validate_python(e) for e in sse_payloads(streamed)]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [SCRIPT[:4]]
    oa.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        tools=[WEATHER],
        max_output_tokens=2,
    )
    rendered = engine.tokenizer.decode(engine.seen_prompts[-1])
    # The template gets the call's arguments as an object (the chat endpoint's rule).
    assert "<assistant><call>get_weather({'city': 'Paris'})\n<tool>sunny\n" in rendered


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x" * 600}, "input"),
        ({"max_output_tokens": 600}, "max_output_tokens"),
    ],
)
def test_what_the_server_does_not_serve_is_a_400_naming_the_field(fake, extra, field):
    client, _ = fake
    refused = client.post("/v1/responses", json={"model": MODEL, "input": "hi"} | extra)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"].startswith(field), json.dumps(refused.json())
