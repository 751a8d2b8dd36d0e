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


def test_five_stop_strings_say_the_limit(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "stop" and "at most 4 stop sequences are allowed, got 5" in error["message"]
