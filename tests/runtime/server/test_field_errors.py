"""Inputs that used to crash or blame the wrong field: each is a 400 naming the field at fault."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", b'{"prompt": "\\ud800 hi", "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "stop": ["\\ud800"]}',
            "stop.0",
        ),
        ("/v1/completions", b'{"prompt": "x", "guided_regex": "\\ud800+"}', "guided_regex"),
        # In a key and its value: the error names the key escaped (rendering it raw was a 500).
        ("/v1/completions", b'{"prompt": "x", "logit_bias": {"\\ud800": "\\ud800"}}', "logit_bias.\\ud800"),
        ("/v1/completions", b'{"\\udfff": 1, "prompt": "x"}', "\\udfff"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_where_it_is(fake, path, raw, param):
    client, _ = fake
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"]


def test_chat_context_overflow_names_messages(fake):
    client, _ = fake
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 600}]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages" and "512" in error["message"]


def test_an_image_part_is_a_400_saying_only_text_is_served(fake):
    client, _ = fake
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    content = [{"type": "text", "text": "What is in it?"}, image]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages.0.content"
    assert "'image_url' are not served, only text" in error["message"]
    text_only = {"messages": [{"role": "user", "content": content[:1]}]}
    assert client.post("/v1/chat/completions", json=text_only).is_success


def test_five_stop_strings_say_the_limit(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "stop" and "at most 4 stop sequences are allowed, got 5" in error["message"]


def nested(depth: int) -> str:
    """JSON arrays `depth` deep, as text (json.dumps itself recurses)."""
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # Found against the served model: a 500 from the lone-surrogate scan's recursion.
        (
            '{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": ' + nested(960) + "}}",
            "response_format",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": ' + nested(5000) + "}", "tools"),
        ('{"prompt": "x", "user": "[[[[", "stop": ["]]"], "logit_bias": ' + nested(65) + "}", "logit_bias"),
    ],
)
def test_a_body_nested_too_deep_is_a_400_naming_the_field(fake, body, param):
    client, _ = fake
    r = client.post("/v1/completions", content=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "deeper than 64 levels" in error["message"]


def test_nesting_inside_strings_and_up_to_the_limit_is_fine(fake):
    client, _ = fake
    schema: dict = {"type": "string"}
    for _ in range(15):  # 15 objects of properties: 62 levels with the request around them
        schema = {"type": "object", "properties": {"a": schema}}
    body = {"prompt": "[" * 100, "max_tokens": 1, "guided_json": schema}
    assert client.post("/v1/completions", json=body).status_code == 200
    r = client.post("/v1/completions", content=b"[" * 3000)
    assert r.status_code == 400 and r.json()["error"]["param"] is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 2**63),  # found against the served model: overflowed in the sampler, killing the engine
        ("top_k", 2**31),
        ("min_tokens", 2**31),
        ("max_tokens", 2**40),
        ("stop_token_ids", [2**31]),
        ("seed", 2**64),
        ("logit_bias", {"5": 101}),
    ],
)
def test_numbers_beyond_the_engines_types_are_a_400_naming_the_field(fake, field, value):
    client, _ = fake
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field


def test_a_stop_token_id_outside_the_vocabulary_is_a_400(fake):
    # Found against the served model with min_tokens >= 1: the sampler indexed the logits with it.
    client, engine = fake
    body = {"prompt": "Hello", "max_tokens": 4, "min_tokens": 1, "stop_token_ids": [engine.vocab_size]}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "stop_token_ids" and f"vocabulary of {engine.vocab_size}" in error["message"]
