"""vLLM's request fields that clients (RL trainers, evaluation harnesses, agents) send, over the
fake engine: token ids beside the text, prompt truncation, special tokens, and the fields this
server does not implement, each a 400 naming it instead of being ignored."""

from __future__ import annotations

import pytest

from .conftest import MODEL
from .fake_engine import SCRIPT, FakeTokenizer
from .test_api_fake_engine import sse_payloads

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


def test_completions_return_token_ids_whole_and_streamed(fake):
    client, engine = fake
    ask = {"model": MODEL, "prompt": "hello", "max_tokens": 6, "return_token_ids": True}
    choice = client.post("/v1/completions", json=ask).json()["choices"][0]
    assert choice["prompt_token_ids"] == engine.tokenizer.encode("hello")
    assert engine.tokenizer.decode(choice["token_ids"]) == choice["text"] == SCRIPT[:6]
    with client.stream("POST", "/v1/completions", json=ask | {"stream": True}) as streamed:
        chunks = [c for p in sse_payloads(streamed) for c in p["choices"]]
    assert chunks[0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == choice["token_ids"]
    plain = client.post("/v1/completions", json=ask | {"return_token_ids": False}).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_chat_returns_token_ids_whole_and_streamed(fake):
    client, engine = fake
    whole = client.post("/v1/chat/completions", json=CHAT | {"return_token_ids": True}).json()
    assert whole["prompt_token_ids"] == engine.seen_prompts[-1]
    assert (
        engine.tokenizer.decode(whole["choices"][0]["token_ids"]) == whole["choices"][0]["message"]["content"]
    )
    with client.stream(
        "POST", "/v1/chat/completions", json=CHAT | {"return_token_ids": True, "stream": True}
    ) as s:
        payloads = sse_payloads(s)
    assert payloads[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    streamed = [t for p in payloads for c in p["choices"] for t in c.get("token_ids", [])]
    assert streamed == whole["choices"][0]["token_ids"]


def test_a_prompt_is_cut_to_its_last_tokens(fake):
    client, engine = fake
    ask = {"model": MODEL, "prompt": "abcdefgh", "max_tokens": 2, "truncate_prompt_tokens": 3, "echo": True}
    body = client.post("/v1/completions", json=ask).json()
    assert engine.seen_prompts[-1] == engine.tokenizer.encode("fgh")
    assert body["usage"]["prompt_tokens"] == 3 and body["choices"][0]["text"] == "fgh" + SCRIPT[:2]
    whole = client.post("/v1/completions", json=ask | {"truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == 8  # shorter than the context: kept whole
    client.post("/v1/completions", json=ask | {"truncation_side": "right"})
    assert engine.seen_prompts[-1] == engine.tokenizer.encode("abc")
    client.post("/v1/chat/completions", json=CHAT | {"truncate_prompt_tokens": 4})
    assert len(engine.seen_prompts[-1]) == 4


def test_special_token_choices_reach_the_tokenizer_and_the_detokenizer(fake):
    client, engine = fake

    class WithBos(FakeTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [1] * add_special_tokens + super().encode(text)

    engine.tokenizer = WithBos()
    ask = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    client.post("/v1/completions", json=ask)
    assert engine.seen_prompts[-1] == [1, 104, 105]
    client.post("/v1/completions", json=ask | {"add_special_tokens": False, "skip_special_tokens": False})
    assert engine.seen_prompts[-1] == [104, 105]
    assert engine.seen_params[-1].skip_special_tokens is False


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/completions", "use_beam_search", True),
        ("/v1/completions", "allowed_token_ids", [1, 2]),
        ("/v1/chat/completions", "bad_words", ["x"]),
        ("/v1/chat/completions", "spaces_between_special_tokens", False),
        ("/v1/completions", "prompt_embeds", "AAAA"),
        ("/v1/chat/completions", "add_special_tokens", True),
        ("/v1/completions", "truncate_prompt_tokens", 0),
        ("/v1/completions", "truncation_side", "middle"),
        ("/v1/chat/completions", "stream_interval", 4),
        ("/v1/chat/completions", "reasoning_effort", "extreme"),
    ],
)
def test_vllm_fields_not_implemented_are_400s_naming_them(fake, path, field, value):
    client, _ = fake
    body = CHAT if path.endswith("chat/completions") else {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    refused = client.post(path, json=body | {field: value})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text


@pytest.mark.parametrize(
    ("field", "value"), [("use_beam_search", False), ("bad_words", []), ("allowed_token_ids", None)]
)
def test_the_same_fields_at_their_defaults_are_accepted(fake, field, value):
    client, _ = fake
    assert client.post("/v1/chat/completions", json=CHAT | {field: value}).status_code == 200
