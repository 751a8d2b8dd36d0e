"""vLLM's --reasoning-parser: a reasoning model's <think>...</think> comes back apart from its
answer, as reasoning_content (and reasoning), whole and streamed alike, with tool calls read from
the answer alone; where the reply starts (inside a think block the chat template opened, or not)
is read from the prompt, so DeepSeek-R1 style templates and Qwen3's hybrid one both split right."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import Response
from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.server.reasoning import (
    ReasoningStream,
    reply_split,
    split_harmony,
    split_reasoning,
    starts_in_reasoning,
)

from .conftest import MODEL, fake_app, wait_ready
from .test_api_fake_engine import sse_payloads
from .test_responses_api import EVENTS

QWEN3_REPLY = "<think>\nThe user greets me.\n</think>\n\nHello there!"


def chat(client, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0} | extra
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def streamed(client, **extra):
    """The stream's reasoning and content, each joined, and its tool calls."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True} | extra
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        deltas = [c["delta"] for p in sse_payloads(response) for c in p["choices"]]
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    return reasoning, content, [c for d in deltas for c in d.get("tool_calls") or ()]


def serving(reasoning_parser: str):
    """(client, engine) over the fake engine with --reasoning-parser `reasoning_parser`."""
    app, engine = fake_app(reasoning_parser=reasoning_parser)
    with TestClient(app) as client:
        wait_ready(client)
        yield client, engine


@pytest.fixture
def served():
    yield from serving("qwen3")


def test_a_qwen3_reply_comes_back_as_reasoning_and_content_whole_and_streamed(served):
    client, engine = served
    engine.script = QWEN3_REPLY
    ask = {"max_tokens": len(QWEN3_REPLY)}
    message = chat(client, **ask)["message"]
    assert message["reasoning_content"] == message["reasoning"] == "\nThe user greets me.\n"
    assert message["content"] == "\n\nHello there!"
    assert streamed(client, **ask)[:2] == ("\nThe user greets me.\n", "\n\nHello there!")
    hidden = chat(client, include_reasoning=False, **ask)["message"]
    assert "reasoning_content" not in hidden and hidden["content"] == "\n\nHello there!"
    assert streamed(client, include_reasoning=False, **ask)[:2] == ("", "\n\nHello there!")


def test_the_prompt_says_whether_the_reply_starts_inside_a_think_block(served):
    """A template that opens the block (DeepSeek-R1, QwQ) makes the reply reasoning until </think>;
    one that closed an empty block (Qwen3 with enable_thinking false) leaves it content; a reply cut
    off while thinking is all reasoning."""
    client, engine = served
    engine.tokenizer.chat_template = "<|user|>hi<|assistant|><think>\n"
    engine.script = "Greet back.</think>Hi!"
    message = chat(client, max_tokens=len(engine.script))["message"]
    assert (message["reasoning_content"], message["content"]) == ("Greet back.", "Hi!")
    assert streamed(client, max_tokens=len(engine.script))[:2] == ("Greet back.", "Hi!")
    cut = chat(client, max_tokens=5)["message"]
    assert (cut["reasoning_content"], cut["content"]) == ("Greet", None)
    engine.tokenizer.chat_template = "<|user|>hi<|assistant|><think>\n\n</think>\n\n"
    engine.script = "Hi! <think> is a tag."
    plain = chat(client, max_tokens=len(engine.script))["message"]
    assert "reasoning_content" not in plain and plain["content"] == engine.script


def test_tool_calls_are_read_from_the_answer_alone(served):
    client, engine = served
    call = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    engine.script = f"<think>I should call <tool_call> weather.</think>{call}"
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    ask = {"max_tokens": len(engine.script), "tools": tools}
    choice = chat(client, **ask)
    assert choice["message"]["reasoning_content"] == "I should call <tool_call> weather."
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["weather"]
    assert choice["finish_reason"] in ("tool_calls", "length")
    reasoning, _, calls = streamed(client, **ask)
    assert reasoning == "I should call <tool_call> weather." and calls[0]["function"]["name"] == "weather"


def test_a_reply_a_grammar_fixes_is_all_content(served):
    client, engine = served
    engine.script = QWEN3_REPLY
    fixed = chat(client, max_tokens=len(QWEN3_REPLY), structured_outputs={"regex": ".*"})["message"]
    assert "reasoning_content" not in fixed and fixed["content"] == QWEN3_REPLY


def test_without_the_flag_the_tags_stay_in_the_content(fake):
    client, engine = fake
    engine.script = QWEN3_REPLY
    message = chat(client, max_tokens=len(QWEN3_REPLY))["message"]
    assert "reasoning_content" not in message and message["content"] == QWEN3_REPLY


def test_the_start_is_read_from_the_prompts_last_think_block():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n")


_PIECES = st.sampled_from(["<think>", "</think>", "<", "</th", "ink>", "a", " ", "\n", "x y"])


@given(st.lists(_PIECES, max_size=12), st.booleans(), st.lists(st.integers(0, 200), max_size=6))
def test_streamed_pieces_add_up_to_the_whole_split(pieces, thinking, cuts):
    text = "".join(pieces)
    reasoning, content = split_reasoning(text, thinking, final=True)
    opens = thinking or text.lstrip().startswith("<think>")
    body = text if thinking else text.lstrip().removeprefix("<think>")
    assert reasoning + content == (body.replace("</think>", "", 1) if opens else text)
    assert not reasoning or opens
    stream, sent = ReasoningStream(reply_split("qwen3", "<think>" if thinking else "")), ""
    bounds = sorted({min(c, len(text)) for c in cuts} | {len(text)})
    for end in bounds:
        sent += stream.feed(text[:end], final=end == len(text))
        assert content.startswith(stream.content)
    assert (sent, stream.content) == (reasoning, content)


def test_the_responses_api_gives_the_reasoning_as_its_own_item_whole_and_streamed(served):
    client, engine = served
    engine.script = QWEN3_REPLY
    ask = {"model": MODEL, "input": "hi", "max_output_tokens": len(QWEN3_REPLY)}
    whole = client.post("/v1/responses", json=ask).json()
    Response.model_validate(whole)
    reasoning, message = whole["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "\nThe user greets me.\n"
    assert message["type"] == "message" and message["content"][0]["text"] == "\n\nHello there!"
    with client.stream("POST", "/v1/responses", json=ask | {"stream": True}) as streamed_response:
        events = [EVENTS.validate_python(e) for e in sse_payloads(streamed_response)]
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, said) == ("\nThe user greets me.\n", "\n\nHello there!")
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "message")]
    assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]


# GPT-OSS's reply in harmony, as its special tokens read when kept in the text.
HARMONY_REPLY = (
    "<|channel|>analysis<|message|>The user greets me.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello there!"
)


@pytest.fixture
def harmony():
    yield from serving("openai_gptoss")


def test_a_gpt_oss_reply_comes_back_as_its_analysis_and_its_final_answer(harmony):
    client, engine = harmony
    engine.script = HARMONY_REPLY
    ask = {"max_tokens": len(HARMONY_REPLY)}
    message = chat(client, **ask)["message"]
    assert message["reasoning_content"] == message["reasoning"] == "The user greets me."
    assert message["content"] == "Hello there!"
    # The channels are told apart by special tokens, so the request keeps them in its text.
    asked = [p for p in engine.params_seen if p.max_tokens == len(HARMONY_REPLY)]
    assert asked and not any(p.skip_special_tokens for p in asked)
    assert streamed(client, **ask)[:2] == ("The user greets me.", "Hello there!")


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    "call",
    [
        # The recipient in the channel header, and in the role (both are harmony).
        "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
        '<|message|>{"zone": "UTC"}',
        '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "UTC"}',
    ],
)
def test_a_gpt_oss_tool_call_comes_back_as_a_tool_call_whole_and_streamed(harmony, call):
    client, engine = harmony
    engine.script = "<|channel|>analysis<|message|>Look the time up.<|end|>" + call
    ask = {"max_tokens": len(engine.script), "tools": TOOLS}
    message = chat(client, **ask)["message"]
    assert message["reasoning_content"] == "Look the time up."
    assert message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_time", '{"zone": "UTC"}')
    ]
    reasoning, content, calls = streamed(client, **ask)
    assert (reasoning, content) == ("Look the time up.", "")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_time", '{"zone": "UTC"}')
    ]


def test_the_harmony_parsers_go_together():
    assert ServerSettings(reasoning_parser="openai_gptoss").tool_parser == "openai"
    assert ServerSettings().tool_parser == "hermes"
    with pytest.raises(ValueError, match="openai_gptoss"):
        ServerSettings(tool_call_parser="openai")
    with pytest.raises(ValueError, match="hermes"):
        ServerSettings(reasoning_parser="openai_gptoss", tool_call_parser="hermes")


def test_harmony_channels_and_a_reply_outside_them():
    reply = (
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Let me check. <|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{}<|return|>"
    )
    assert split_harmony(reply, final=True) == ("think", "Let me check. {}")
    called = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"
    assert split_harmony(called, final=True) == ("", "<|call|>f<|message|>{}")
    assert split_harmony("plain text", final=True) == ("", "plain text")
    # An unfinished header or marker decides nothing yet.
    assert split_harmony("<|channel|>analysis<|message|>ab<|chan", final=False) == ("ab", "")
    assert split_harmony("<|channel|>analy", final=False) == ("", "")


_HARMONY_PIECES = st.sampled_from(
    [
        "<|channel|>",
        "analysis",
        "final",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|",
        "a b",
        "\n",
    ]
)


@given(st.lists(_HARMONY_PIECES, max_size=14), st.lists(st.integers(0, 200), max_size=6))
def test_streamed_harmony_pieces_add_up_to_the_whole_split(pieces, cuts):
    text = "".join(pieces)
    reasoning, content = split_harmony(text, final=True)
    stream, sent = ReasoningStream(reply_split("openai_gptoss", "")), ""
    bounds = sorted({min(c, len(text)) for c in cuts} | {len(text)})
    for end in bounds:
        sent += stream.feed(text[:end], final=end == len(text))
        assert content.startswith(stream.content)
    assert (sent, stream.content) == (reasoning, content)
