"""vLLM's request fields that clients (RL trainers, evaluation harnesses, agents) send, over the
fake engine: a list of prompts in one request, token ids beside the text, prompt truncation,
special tokens, and the fields this server does not implement, each a 400 naming it instead of
being ignored."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from .conftest import MODEL, fake_app, wait_ready
from .fake_engine import SCRIPT, FakeTokenizer
from .test_api_fake_engine import sse_payloads

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


def test_a_list_of_prompts_is_answered_in_one_response_numbered_as_vllm_numbers_it(fake):
    """Prompt p's samples are choices p * n .. p * n + n - 1; usage sums every prompt's; streamed
    chunks add up to the whole response (lm-evaluation-harness batches prompts this way)."""
    client, engine = fake
    ask = {"model": MODEL, "prompt": ["ab", "hi"], "n": 2, "max_tokens": 3, "echo": True}
    answered = client.post("/v1/completions", json=ask)
    assert answered.status_code == 200, answered.text
    whole = answered.json()
    texts = {c["index"]: c["text"] for c in whole["choices"]}
    assert texts == {0: "ab" + SCRIPT[:3], 1: "ab" + SCRIPT[1:4], 2: "hi" + SCRIPT[:3], 3: "hi" + SCRIPT[1:4]}
    assert whole["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert sorted(map(tuple, engine.seen_prompts[-2:])) == [(97, 98), (104, 105)]
    as_ids = client.post("/v1/completions", json=ask | {"prompt": [[97, 98], [104, 105]]}).json()
    assert {c["index"]: c["text"] for c in as_ids["choices"]} == texts
    streamed_ask = ask | {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=streamed_ask) as streamed:
        payloads = sse_payloads(streamed)
    streamed_texts = dict.fromkeys(texts, "")
    for c in (c for p in payloads for c in p["choices"]):
        streamed_texts[c["index"]] += c["text"]
    assert streamed_texts == texts and payloads[-1]["usage"] == whole["usage"]
    # One text prompt is one prompt, however long (its characters are not a batch).
    long = client.post("/v1/completions", json={"model": MODEL, "prompt": "y" * 300, "n": 2, "max_tokens": 1})
    assert long.status_code == 200 and len(long.json()["choices"]) == 2, long.text


def test_a_batch_with_a_prompt_the_engine_refuses_is_a_400_and_runs_nothing(fake):
    client, engine = fake
    for stream in (False, True):
        ask = {"model": MODEL, "prompt": ["ab", "x" * 600], "max_tokens": 3, "stream": stream}
        refused = client.post("/v1/completions", json=ask)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt", refused.text
        assert "600" in refused.json()["error"]["message"]
    assert not engine.running and not engine.requests


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
        ("/v1/completions", "allowed_token_ids", []),
        ("/v1/chat/completions", "bad_words", ["x"] * 129),
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


def test_logprobs_name_tokens_by_id_when_asked_and_by_default_with_the_server_flag(fake):
    """vLLM's return_tokens_as_token_ids: each token in logprobs is token_id:<id> (a byte of a
    UTF-8 character has no text of its own); offsets and bytes stay those of the text; the server's
    --return-tokens-as-token-ids makes it the default, which a request may turn off."""
    client, _ = fake
    ask = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "logprobs": 2, "return_token_ids": True}
    plain = client.post("/v1/completions", json=ask).json()["choices"][0]
    named = client.post("/v1/completions", json=ask | {"return_tokens_as_token_ids": True}).json()
    choice = named["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(k.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for k in top)
    assert [int(k[9:]) for k in choice["logprobs"]["top_logprobs"][0]] == [
        ord(k) for k in plain["logprobs"]["top_logprobs"][0]
    ]
    assert choice["logprobs"]["text_offset"] == plain["logprobs"]["text_offset"]
    chat = CHAT | {"logprobs": True, "top_logprobs": 2}
    by_text = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]["content"]
    chat_named = chat | {"return_tokens_as_token_ids": True}
    by_id = client.post("/v1/chat/completions", json=chat_named).json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in by_id] == [f"token_id:{ord(e['token'])}" for e in by_text]
    assert [e["bytes"] for e in by_id] == [e["bytes"] for e in by_text]
    app, _ = fake_app(return_tokens_as_token_ids=True)
    with TestClient(app) as flagged:
        wait_ready(flagged)
        default = flagged.post("/v1/completions", json=ask).json()["choices"][0]["logprobs"]["tokens"]
        assert all(t.startswith("token_id:") for t in default)
        off = ask | {"return_tokens_as_token_ids": False}
        assert flagged.post("/v1/completions", json=off).json()["choices"][0]["logprobs"] == plain["logprobs"]
