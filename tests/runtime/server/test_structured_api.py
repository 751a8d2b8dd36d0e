"""The structured-output fields at the HTTP edge (fake engine): each spelling reaches the engine as
one constraint, and a constraint that cannot be enforced is a 400 naming its field."""

from __future__ import annotations

import json

import pytest
from pagoda_runtime.engine.structured_outputs import StructuredOutputs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("path", "fields", "expected"),
    [
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },
            StructuredOutputs(json=json.dumps(SCHEMA)),
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_object"}},
            StructuredOutputs(json_object=True),
        ),
        ("/v1/chat/completions", {"response_format": {"type": "text"}}, None),
        ("/v1/completions", {"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutputs(regex="[0-9]+")),
        (
            "/v1/completions",
            {"structured_outputs": {"choice": ["a", "b"]}},
            StructuredOutputs(choice=("a", "b")),
        ),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"json": json.dumps(SCHEMA)}},
            StructuredOutputs(json=json.dumps(SCHEMA)),
        ),
        ("/v1/completions", {"guided_json": SCHEMA}, StructuredOutputs(json=json.dumps(SCHEMA))),
        ("/v1/completions", {"guided_choice": ["x"]}, StructuredOutputs(choice=("x",))),
        ("/v1/chat/completions", {"guided_regex": "a|b"}, StructuredOutputs(regex="a|b")),
        (
            "/v1/chat/completions",
            {"guided_grammar": 'root ::= "a"'},
            StructuredOutputs(grammar='root ::= "a"'),
        ),
    ],
)
def test_each_spelling_reaches_the_engine(fake, path, fields, expected):
    client, engine = fake
    prompt = (
        {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    )
    r = client.post(path, json={**prompt, "max_tokens": 2, **fields})
    assert r.status_code == 200, r.text
    assert engine.seen_params[-1].structured_outputs == expected


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", '"uniqueItems"'),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
            "response_format.json_schema.schema",
            '"not"',
        ),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs", "unclosed character class"),
        (
            {"structured_outputs": {"grammar": "root ::= (("}},
            "structured_outputs",
            "neither valid Lark nor GBNF",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
        (
            {"structured_outputs": {"whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
            "Extra",
        ),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "not several"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema object"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences"),
    ],
)
def test_an_unenforceable_constraint_is_a_400_naming_its_field(fake, fields, param, words):
    client, engine = fake
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_stop_token_ids_and_include_stop_str_reach_the_engine(fake):
    client, engine = fake
    body = {"prompt": "x", "max_tokens": 2, "stop_token_ids": [5, 7], "include_stop_str_in_output": True}
    assert client.post("/v1/completions", json=body).status_code == 200
    params = engine.seen_params[-1]
    assert params.stop_token_ids == [5, 7] and params.include_stop_str_in_output
