"""Hypothesis strategies for OpenAI request bodies: mostly valid, with a few fields made wrong.

Valid requests are kept cheap (at most 3 tokens, n <= 2) so that a run stays short on a CPU.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.integers(-3, 70000), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
# Small JSON schemas, some with keywords the grammar engine refuses (uniqueItems, not).
_schema = st.one_of(
    st.just({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    st.just({"type": "string", "maxLength": 3}),
    st.just({"enum": ["x", "y"]}),
    st.just({"type": "array", "uniqueItems": True}),
    st.just({"not": {"type": "string"}}),
    st.dictionaries(st.sampled_from(["type", "minimum", "pattern", "$ref"]), junk, max_size=2),
)
_regex = st.one_of(st.sampled_from(["[0-9]", "a|b", "[a-", "(x", "\\d{2}"]), st.text(max_size=6))
_choice = st.lists(st.text(max_size=4), max_size=3)
_grammar = st.one_of(
    st.sampled_from(['root ::= "a" | "b"', 'start: "x"', "root ::= ((", ""]), st.text(max_size=8)
)
_structured = st.one_of(
    st.fixed_dictionaries(
        {}, optional={"json": _schema, "regex": _regex, "choice": _choice, "grammar": _grammar}
    ),
    st.fixed_dictionaries({"json_object": st.booleans()}),
    st.fixed_dictionaries({"whitespace_pattern": st.text(max_size=3)}),
)
_response_format = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])}),
    st.fixed_dictionaries(
        {
            "type": st.just("json_schema"),
            "json_schema": st.fixed_dictionaries(
                {"name": st.sampled_from(["x", "a b", ""])},
                optional={"schema": _schema, "strict": st.booleans()},
            ),
        }
    ),
)
_sampling = {
    "n": st.integers(1, 2),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1, max_size=4), max_size=4)),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": st.text(max_size=8),
    "top_k": st.integers(-1, 50),
    "stop_token_ids": st.lists(st.integers(-1, 70000), max_size=3),
    "include_stop_str_in_output": st.booleans(),
    "response_format": _response_format,
    "structured_outputs": _structured,
    "guided_json": _schema,
    "guided_regex": _regex,
    "guided_choice": _choice,
    "guided_grammar": _grammar,
}
_completion = {
    **_sampling,
    "logprobs": st.integers(0, 5),
    "prompt": st.one_of(
        st.text(min_size=1, max_size=40), st.lists(st.integers(0, 40000), min_size=1, max_size=6)
    ),
}
_tool_call = st.fixed_dictionaries(
    {
        "id": st.text(max_size=6),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["get_weather", "f"]),
                "arguments": st.sampled_from(['{"city": "x"}', "{", ""]),
            }
        ),
    }
)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
        "content": st.one_of(
            st.none(),
            st.text(max_size=30),
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=9)})),
        ),
    },
    optional={"tool_call_id": st.text(max_size=6), "tool_calls": st.lists(_tool_call, max_size=2)},
)
_tool = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "function", "custom"]),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["get_weather", "f", "bad name"])},
            optional={"description": st.text(max_size=8), "parameters": _schema},
        ),
    }
)
_tool_choice = st.one_of(
    st.sampled_from(["none", "auto", "required", "any"]),
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "g"])}),
        }
    ),
)
_chat = {
    **_sampling,
    "messages": st.lists(_message, min_size=1, max_size=3),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20),
    "tools": st.lists(_tool, max_size=2),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": st.booleans(),
}
# Wrong values a client might send for a field, on top of wrong types.
_wrong = st.one_of(junk, st.integers(max_value=0), st.integers(min_value=5000), st.floats(min_value=2.5))


def _body(model: str, fields: dict, required: list[str]):
    valid = st.fixed_dictionaries(
        {"model": st.just(model), "max_tokens": st.integers(1, 3), **{k: fields[k] for k in required}},
        optional={k: v for k, v in fields.items() if k not in required},
    )
    names = st.sampled_from(sorted({"model", "max_tokens", "max_completion_tokens", *fields}))
    wrong = st.dictionaries(names, _wrong, max_size=2)
    dropped = st.sets(st.sampled_from(["model", "max_tokens", *required]), max_size=1)

    def build(parts) -> bytes:
        body, changes, drop = parts
        body = {**body, **changes}
        for name in drop:
            body.pop(name, None)
        # Only wrong values may ask for more than 3 tokens: a missing limit here would mean the whole context.
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = 2
        return json.dumps(body).encode()

    return st.tuples(valid, wrong, dropped).map(build)


_tokenize = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["fake-model", "smollm2-135m", "other"]),
        "prompt": st.one_of(st.text(max_size=20), junk),
        "messages": st.lists(_message, max_size=2),
        "tools": st.lists(_tool, max_size=1),
        "add_special_tokens": st.booleans(),
        "return_token_strs": st.one_of(st.booleans(), junk),
    },
)
_detokenize = st.fixed_dictionaries({"tokens": st.one_of(st.lists(st.integers(-2, 70000), max_size=5), junk)})


def request_bodies(model: str):
    """(path, raw body) pairs for the generating endpoints and /tokenize, /detokenize, including
    bodies that are not JSON at all."""
    paths = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
    return st.one_of(
        st.tuples(st.just("/v1/completions"), _body(model, _completion, ["prompt"])),
        st.tuples(st.just("/v1/chat/completions"), _body(model, _chat, ["messages"])),
        st.tuples(st.just("/tokenize"), _tokenize.map(lambda body: json.dumps(body).encode())),
        st.tuples(st.just("/detokenize"), _detokenize.map(lambda body: json.dumps(body).encode())),
        st.tuples(st.sampled_from(paths), st.binary(max_size=30)),
    )


def check_response(status: int, content_type: str, body: bytes) -> None:
    assert status < 500, body[:500]
    if status != 200:
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"]
    elif content_type.startswith("text/event-stream"):
        assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    else:
        answer = json.loads(body)
        assert answer.get("choices") or "tokens" in answer or "prompt" in answer, answer
