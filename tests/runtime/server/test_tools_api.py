"""Tool calling at the HTTP edge over the fake engine, driven by the official OpenAI client: the
calls a parser finds come back whole and streamed alike, tool_choice reaches the grammar."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient
from pagoda_runtime.server.tool_parsers import HermesParser, Llama3JsonParser, ToolCallStream, parse_whole

from .conftest import MODEL, fake_app, wait_ready

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
END = "#END"  # the fake engine's "EOS": a stop string after the script, so the finish is "stop"


@pytest.fixture
def client(fake):
    http, engine = fake
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http), engine


def ask(client, script: str, **fields):
    api, engine = client
    engine.script = script + END
    messages = [{"role": "user", "content": "weather in Paris?"}]
    return api.chat.completions.create(
        model="fake-model", messages=messages, tools=[WEATHER, CLOCK], max_tokens=200, stop=[END], **fields
    )


@pytest.mark.parametrize("prefix", ["", "Let me check. "])
def test_a_hermes_call_comes_back_whole_and_streamed_alike(client, prefix):
    whole = ask(client, prefix + CALL)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == (prefix.strip() or None)
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(ask(client, prefix + CALL, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert content.strip() == prefix.strip()
    assert [(d.index, d.function.name) for d in deltas] == [(0, "get_weather")]
    assert json.loads(deltas[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_openai_stream_helper_assembles_two_parallel_calls(client):
    api, engine = client
    engine.script = (
        CALL + "\n" + CALL.replace("get_weather", "get_time").replace('{"city": "Paris"}', "{}") + END
    )
    messages = [{"role": "user", "content": "x"}]
    with api.chat.completions.stream(
        model="fake-model", messages=messages, tools=[WEATHER, CLOCK], max_tokens=300, stop=[END]
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {}]
    assert final.choices[0].finish_reason == "tool_calls"


def test_plain_text_with_tools_stays_content(client):
    whole = ask(client, "It is sunny.")
    assert whole.choices[0].message.content == "It is sunny." and whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"


def test_tool_choice_none_leaves_a_call_as_text(client):
    whole = ask(client, CALL, tool_choice="none")
    assert whole.choices[0].message.content == CALL and whole.choices[0].message.tool_calls is None


def test_named_tool_choice_forces_its_arguments_schema(client):
    _, engine = client
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = ask(client, '{"city": "Oslo"}', tool_choice=choice)
    assert json.loads(engine.seen_params[-1].structured_outputs.json) == WEATHER["function"]["parameters"]
    [call] = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].message.content is None
    # Cut by length, not a stop string: the fake engine streams a stop string's first characters.
    api, engine = client
    engine.script = '{"city": "Oslo"}'
    chunks = api.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "x"}],
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=len(engine.script),
        stream=True,
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"city": "Oslo"}


def test_required_tool_choice_forces_an_array_of_calls(client):
    _, engine = client
    whole = ask(
        client, '[{"name": "get_time", "parameters": {}}]', tool_choice="required", parallel_tool_calls=False
    )
    schema = json.loads(engine.seen_params[-1].structured_outputs.json)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["get_time"]
    assert whole.choices[0].finish_reason == "tool_calls"


def test_tools_and_a_tool_conversation_reach_the_template(client):
    api, engine = client
    engine.script = "ok" + END
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
    ]
    api.chat.completions.create(
        model="fake-model", messages=messages, tools=[WEATHER], max_tokens=5, stop=[END]
    )
    rendered = "".join(chr(t) for t in engine.seen_prompts[-1])
    assert rendered.startswith("<tools>get_weather\n")
    assert "<assistant><call>get_weather({'city': 'Rome'})" in rendered and "<tool>21C" in rendered


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0.type"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_tool_errors_name_their_field(fake, fields, param):
    http, _ = fake
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_tool_message_needs_its_call_id(fake):
    http, _ = fake
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "tool", "content": "21C"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0", r.text


def test_llama3_json_calls_whole_and_streamed():
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    content, calls = parse_whole(Llama3JsonParser(), text)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("a", {"x": 1}),
        ("b", {}),
    ]
    stream, sent = ToolCallStream(Llama3JsonParser()), []
    for end in range(1, len(text) + 1):
        sent.append(stream.feed(text[:end], end == len(text)))
    assert "".join(c for c, _ in sent) == "" and [d.function.name for _, ds in sent for d in ds] == ["a", "b"]
    assert parse_whole(Llama3JsonParser(), "Hello {not json") == ("Hello {not json", [])


def test_hermes_streaming_holds_back_only_what_may_start_a_call():
    stream = ToolCallStream(HermesParser())
    assert stream.feed("Sure <tool", False) == ("Sure ", [])
    assert stream.feed("Sure <toolbox>", False) == ("<toolbox>", [])
    content, calls = stream.feed("Sure <toolbox><tool_call>{broken</tool_call>", True)
    assert content == "<tool_call>{broken</tool_call>" and calls == []


def test_required_calls_stream_one_delta_each(client):
    api, engine = client
    engine.script = (
        '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    )
    chunks = api.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "x"}],
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        max_tokens=len(engine.script),
        stream=True,
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert [(d.index, d.function.name) for d in deltas] == [(0, "get_time"), (1, "get_weather")]
    assert json.loads(deltas[1].function.arguments) == {"city": "Rome"}


def test_auto_tool_choice_turned_off_is_a_400_naming_tool_choice():
    app, _ = fake_app(enable_auto_tool_choice=False)
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 2}
    with TestClient(app) as client:
        wait_ready(client)
        for choice in ({}, {"tool_choice": "auto"}):
            refused = client.post("/v1/chat/completions", json=body | choice)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == "tool_choice"
        assert client.post("/v1/chat/completions", json=body | {"tool_choice": "none"}).status_code == 200
