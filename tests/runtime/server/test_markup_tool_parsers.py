"""The tool-call markup of DeepSeek V3 / V3.1, GLM-4.5, Qwen3-Coder, MiniMax-M2, Mistral, Kimi K2 and
the pythonic lists (vLLM's parser names): calls found whole and streamed alike, bare-text arguments
typed by the request's tool schema, content before the markup kept, broken markup left as content;
through the HTTP edge with the official client; and markup the tokenizer holds as special tokens
kept in the decoded text."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pagoda_runtime.server.tool_parsers import ToolCallStream, parse_whole, parser_named

from .conftest import fake_app, wait_ready

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "zip": {"type": "string"},
                "hourly": {"type": "boolean"},
                "spots": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
# What each call below means: typed as the schema declares ("75001" stays a string).
WEATHER_ARGS = {"city": "São Paulo", "days": 3, "zip": "75001", "hourly": True, "spots": ["a", "b"]}

_BEGIN, _END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_ARGS = json.dumps(WEATHER_ARGS, ensure_ascii=False)
_CALL, _CALL_END, _SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _xml_pairs(open_key, close_key, open_value, close_value):
    values = {"city": "São Paulo", "days": "3", "zip": "75001", "hourly": "true", "spots": '["a", "b"]'}
    return "".join(f"{open_key(k)}{close_key}{open_value}{v}{close_value}" for k, v in values.items())


# parser -> (markup of get_weather(WEATHER_ARGS) then get_time(), as the model writes it)
MARKUP = {
    "deepseek_v3": _BEGIN
    + f"{_CALL}function{_SEP}get_weather\n```json\n{_ARGS}\n```{_CALL_END}\n"
    + f"{_CALL}function{_SEP}get_time\n```json\n{{}}\n```{_CALL_END}"
    + _END,
    "deepseek_v31": _BEGIN
    + f"{_CALL}get_weather{_SEP}{_ARGS}{_CALL_END}"
    + f"{_CALL}get_time{_SEP}{{}}{_CALL_END}"
    + _END,
    "glm45": "<tool_call>get_weather\n"
    + _xml_pairs(lambda k: f"<arg_key>{k}", "</arg_key>\n", "<arg_value>", "</arg_value>\n")
    + "</tool_call>\n<tool_call>get_time\n</tool_call>",
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n"
    + _xml_pairs(lambda k: f"<parameter={k}>", "\n", "", "\n</parameter>\n")
    + "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n'
    + _xml_pairs(lambda k: f'<parameter name="{k}">', "", "", "</parameter>\n")
    + '</invoke>\n<invoke name="get_time">\n</invoke>\n</minimax:tool_call>',
    "mistral": "[TOOL_CALLS]"
    + json.dumps([{"name": "get_weather", "arguments": WEATHER_ARGS}, {"name": "get_time", "arguments": {}}]),
    "kimi_k2": "<|tool_calls_section_begin|>"
    + f"<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{_ARGS}<|tool_call_end|>"
    + "<|tool_call_begin|> functions.get_time:1 <|tool_call_argument_begin|>{}<|tool_call_end|>"
    + "<|tool_calls_section_end|>",
}
EXPECTED = [("get_weather", WEATHER_ARGS), ("get_time", {})]


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name", sorted(MARKUP))
@pytest.mark.parametrize("prefix", ["", "Let me look that up. "])
def test_calls_are_found_whole_and_streamed_alike_with_typed_arguments(name, prefix):
    text = prefix + MARKUP[name]
    content, calls = parse_whole(parser_named(name, SCHEMAS), text)
    assert content == (prefix.strip() or None) and _calls(calls) == EXPECTED
    stream, streamed, deltas = ToolCallStream(parser_named(name, SCHEMAS)), "", []
    for end in range(1, len(text) + 1):
        piece, new = stream.feed(text[:end], end == len(text))
        streamed += piece
        deltas += new
    assert streamed.strip() == prefix.strip()
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (i, n, a) for i, (n, a) in enumerate(EXPECTED)
    ]


@pytest.mark.parametrize("name", sorted(MARKUP))
def test_markup_that_never_closes_or_does_not_parse_is_content(name):
    unclosed = MARKUP[name][: len(MARKUP[name]) // 3]
    assert parse_whole(parser_named(name, SCHEMAS), "Hi " + unclosed) == ("Hi " + unclosed, [])
    assert parse_whole(parser_named(name, SCHEMAS), "No call here.") == ("No call here.", [])


def test_mistral_v11_calls_each_follow_their_own_marker():
    text = f"Sure.[TOOL_CALLS]get_weather[ARGS]{_ARGS}[TOOL_CALLS]get_time[ARGS]{{}}"
    content, calls = parse_whole(parser_named("mistral", SCHEMAS), text)
    assert content == "Sure." and _calls(calls) == EXPECTED


def test_a_pythonic_list_is_the_calls_and_anything_else_is_content():
    listed = '[get_weather(city="São Paulo", days=3, zip="75001", hourly=True, spots=["a", "b"]), get_time()]'
    texts = [("pythonic", listed), ("pythonic", f"<|python_start|>{listed}<|python_end|>")]
    # vLLM's llama4_pythonic: Llama 4's template writes the list between its python markers.
    texts.append(("llama4_pythonic", f"<|python_start|>{listed}<|python_end|>"))
    for name, text in texts:
        stream, streamed, deltas = ToolCallStream(parser_named(name, SCHEMAS)), "", []
        for end in range(1, len(text) + 1):
            piece, new = stream.feed(text[:end], end == len(text))
            streamed += piece
            deltas += new
        assert (
            streamed == ""
            and [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == EXPECTED
        )
    for content in ("Paris is sunny.", "[1, 2]", "[get_weather(*cities)]", "[open(x=os.environ)]"):
        assert parse_whole(parser_named("pythonic", SCHEMAS), content) == (content, [])


@pytest.mark.parametrize(
    "name", ["hermes", "llama3_json", "deepseek_v31", "glm45", "mistral", "pythonic", "kimi_k2"]
)
def test_json_nested_past_the_recursion_limit_is_content_not_an_error(name):
    deep = "[" * 100_000
    texts = {
        "kimi_k2": MARKUP["kimi_k2"].replace("{}", deep),
        "hermes": f"<tool_call>{deep}</tool_call>",
        "llama3_json": '{"a":' * 50_000,
        "deepseek_v31": f"{_BEGIN}{_CALL}get_time{_SEP}{deep}{_CALL_END}{_END}",
        "glm45": f"<tool_call>get_weather<arg_key>days</arg_key><arg_value>{deep}</arg_value></tool_call>",
        "mistral": f"[TOOL_CALLS]{deep}",
        "pythonic": deep,
    }
    content, calls = parse_whole(parser_named(name, SCHEMAS), texts[name])
    if name == "glm45":  # the value stays text
        assert _calls(calls) == [("get_weather", {"days": deep})]
    elif name == "kimi_k2":  # the well-formed call stays a call
        assert _calls(calls) == EXPECTED[:1]
    else:
        assert (content, calls) == (texts[name], [])


def test_json_arguments_that_do_not_parse_make_no_deepseek_call():
    broken = f"{_BEGIN}{_CALL}get_time{_SEP}{{not json{_CALL_END}{_END}"
    assert parse_whole(parser_named("deepseek_v31", SCHEMAS), broken) == (broken, [])


def test_a_parameter_the_tool_does_not_declare_or_an_untyped_value_stays_text():
    text = "<tool_call>get_weather\n<arg_key>note</arg_key>\n<arg_value>42</arg_value>\n"
    text += "<arg_key>days</arg_key>\n<arg_value>soon</arg_value>\n</tool_call>"
    _, calls = parse_whole(parser_named("glm45", SCHEMAS), text)
    assert _calls(calls) == [("get_weather", {"note": "42", "days": "soon"})]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(MARKUP)), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_any_streaming_cut_gives_the_whole_texts_content_and_calls(name, cuts):
    text = "Checking. " + MARKUP[name]
    ends = sorted({c % len(text) for c in cuts} | {len(text)})
    stream, streamed, deltas = ToolCallStream(parser_named(name, SCHEMAS)), "", []
    for end in ends:
        piece, new = stream.feed(text[:end], end == len(text))
        streamed += piece
        deltas += new
    content, calls = parse_whole(parser_named(name, SCHEMAS), text)
    assert streamed.strip() == content and [(d.function.name, d.function.arguments) for d in deltas] == [
        (c.name, c.arguments) for c in calls
    ]


def test_kimi_k2_calls_keep_the_ids_the_model_wrote_whole_and_streamed():
    """Kimi's chat template names a tool's result by the call's id, so the id sent is the model's
    functions.NAME:INDEX, not a new one; a call without a name or with broken JSON is no call."""
    _, calls = parse_whole(parser_named("kimi_k2", SCHEMAS), MARKUP["kimi_k2"])
    assert [c.id for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]
    assert "id" not in calls[0].model_dump()
    stream = ToolCallStream(parser_named("kimi_k2", SCHEMAS))
    _, deltas = stream.feed(MARKUP["kimi_k2"], True)
    assert [d.id for d in deltas] == ["functions.get_weather:0", "functions.get_time:1"]
    begin, arguments, end = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
    for broken in (f"{begin}functions.:0{arguments}{{}}{end}", f"{begin}functions.f:0{arguments}{{x{end}"):
        text = f"<|tool_calls_section_begin|>{broken}<|tool_calls_section_end|>"
        assert parse_whole(parser_named("kimi_k2", SCHEMAS), text) == (text, [])


@pytest.mark.parametrize("name", ["glm45", "qwen3_coder", "minimax_m2"])
def test_an_xml_call_reaches_the_client_whole_and_streamed(name):
    app, engine = fake_app(tool_call_parser=name)
    with TestClient(app) as http:
        wait_ready(http)
        api = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
        ask = dict(
            model="fake-model",
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER, CLOCK],
            max_tokens=400,
            stop=["#END"],
        )
        # The fake tokenizer has one token per byte below 256: keep the text ASCII.
        engine.script = "On it. " + MARKUP[name].replace("São", "Sao") + "#END"
        expected = [("get_weather", WEATHER_ARGS | {"city": "Sao Paulo"}), ("get_time", {})]
        whole = api.chat.completions.create(**ask).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.content == "On it."
        assert [
            (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls
        ] == expected
        chunks = list(api.chat.completions.create(**ask, stream=True))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
        assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == expected


def test_markup_held_as_special_tokens_is_kept_in_the_decoded_text():
    app, engine = fake_app(tool_call_parser="glm45")
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    with TestClient(app) as http:
        wait_ready(http)
        engine.tokenizer.special_tokens = frozenset({"<tool_call>", "</tool_call>"})
        http.post("/v1/chat/completions", json=body | {"tools": [CLOCK]})
        http.post("/v1/chat/completions", json=body)  # no tools: the markup does not matter
        engine.tokenizer.special_tokens = frozenset()
        http.post("/v1/chat/completions", json=body | {"tools": [CLOCK]})
    assert [params.skip_special_tokens for params in engine.seen_params] == [False, True, True]
