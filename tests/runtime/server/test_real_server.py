"""The real server process with the bundled model, driven by the official OpenAI client and raw HTTP."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest
from loopback_client import metric

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_completion_whole_and_streamed_agree_with_exact_usage(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0)
    choice = whole.choices[0]
    assert choice.finish_reason in ("length", "stop") and choice.text
    assert whole.usage.completion_tokens == len(choice.logprobs.tokens)
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    if choice.finish_reason == "length":
        assert whole.usage.completion_tokens == 8
    assert "".join(choice.logprobs.tokens) == choice.text

    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == choice.text
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_prompt_token_ids_are_counted_exactly(client):
    ids = [504, 3458, 2361, 314, 253]
    result = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert result.usage.prompt_tokens == len(ids) and result.usage.completion_tokens == 3


def test_n_samples_each_count_in_usage(client):
    result = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, n=3, temperature=1.0, seed=7, logprobs=0
    )
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    assert result.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in result.choices)


def test_stop_string_ends_the_text_before_it(client):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = " " + words[2]
    stopped = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop]
    ).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free[: free.index(stop)]


def test_chat_whole_and_streamed_agree(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a fruit."}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=8, temperature=0
    )
    message = whole.choices[0].message
    assert message.role == "assistant" and message.content
    assert whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens > 10
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices) == message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_logprobs_in_openai_format(client):
    result = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob


def test_unknown_model_and_context_overflow(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as overflow:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5000)
    assert "1024" in str(overflow.value) and "5000" in str(overflow.value)


def test_a_list_of_prompts_gives_each_prompt_its_own_greedy_completion(client):
    """A batch of prompts in one request (as lm-evaluation-harness sends them): choice i is prompt
    i's, the same text the prompt gets alone, whole and streamed."""
    prompts = [PROMPT, "Once upon a time", "def fibonacci(n):"]
    alone = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).choices[0].text
        for p in prompts
    ]
    batched = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.text for c in sorted(batched.choices, key=lambda c: c.index)] == alone
    assert batched.usage.completion_tokens == sum(
        client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).usage.completion_tokens
        for p in prompts
    )
    streamed = [""] * len(prompts)
    for chunk in client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=6, temperature=0, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == alone


def test_the_responses_api_answers_as_the_chat_endpoint_does(client):
    """OpenAI's Responses API through the official client: the same greedy text the chat endpoint
    gives the same turn, whole and streamed, with its token counts."""
    question = "Name a primary color."
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=6, temperature=0
    )
    response = client.responses.create(model=MODEL, input=question, max_output_tokens=6, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    events = list(
        client.responses.create(model=MODEL, input=question, max_output_tokens=6, temperature=0, stream=True)
    )
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert events[-1].response.output_text == response.output_text


def test_echo_with_logprobs_scores_the_prompt_as_evaluation_harnesses_ask(client):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, one token. The text is the
    prompt and the completion; the logprobs cover every prompt token (the first null, nothing
    predicts it) and then the completion's, whole and streamed alike."""
    ask = dict(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=1)
    whole = client.completions.create(**ask).choices[0]
    prompt_tokens = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).usage.prompt_tokens
    assert whole.text.startswith(PROMPT) and len(whole.text) > len(PROMPT)
    logprobs = whole.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == prompt_tokens + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(len(top) >= 1 for top in logprobs.top_logprobs[1:])
    # The greedy completion token is its position's most likely one.
    last_top = logprobs.top_logprobs[-1]
    assert max(last_top, key=last_top.get) == logprobs.tokens[-1]
    chunks = list(client.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text
    streamed = [
        lp
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == logprobs.token_logprobs


def test_prompt_logprobs_are_reported_as_vllm_reports_them(server):
    """vLLM's prompt_logprobs field: per prompt token (None for the first) an entry keyed by token
    id with its logprob, rank and text, plus the k likeliest; the values are the ones echo reports,
    on both endpoints."""
    ask = dict(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=1)
    whole = httpx.post(server.url + "/v1/completions", json=ask | {"prompt_logprobs": 2}, timeout=120)
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    echoed, scored = choice["logprobs"], choice["prompt_logprobs"]
    prompt_tokens = whole.json()["usage"]["prompt_tokens"]
    assert len(scored) == prompt_tokens and scored[0] is None
    for position, entry in enumerate(scored[1:], start=1):
        own = [e for e in entry.values() if e["decoded_token"] == echoed["tokens"][position]]
        assert own and own[0]["logprob"] == pytest.approx(echoed["token_logprobs"][position], abs=1e-6)
        assert 2 <= len(entry) <= 3  # the top 2, and the prompt token when not among them
        by_rank = sorted(entry.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in by_rank[:2]] == [1, 2]
        assert by_rank[0]["logprob"] >= by_rank[1]["logprob"] >= min(e["logprob"] for e in by_rank)
        assert own[0]["rank"] >= 1 and (own[0]["rank"] <= 2) == (len(entry) == 2)
    # Without the field the choice carries none (the response is OpenAI's, unchanged).
    assert (
        "prompt_logprobs"
        not in httpx.post(server.url + "/v1/completions", json=ask, timeout=120).json()["choices"][0]
    )

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 2}
    answered = httpx.post(
        server.url + "/v1/chat/completions", json=chat | {"prompt_logprobs": 0}, timeout=120
    )
    assert answered.status_code == 200, answered.text
    chat_scored = answered.json()["prompt_logprobs"]
    assert len(chat_scored) == answered.json()["usage"]["prompt_tokens"] and chat_scored[0] is None
    assert all(len(entry) == 1 and next(iter(entry.values()))["rank"] >= 1 for entry in chat_scored[1:])


def test_echo_with_no_tokens_scores_the_prompt_alone(server):
    """OpenAI's legacy and vLLM's echo with max_tokens 0: the answer is the prompt and its logprobs,
    no completion token shown or counted, whole and streamed alike."""
    ask = dict(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    whole = httpx.post(server.url + "/v1/completions", json=ask, timeout=120).json()
    choice = whole["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == whole["usage"]["prompt_tokens"]
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert whole["usage"]["completion_tokens"] == 0
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=ask | {"stream": True}, timeout=120
    ) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert "".join(c["text"] for e in events for c in e["choices"]) == PROMPT
    logprobs = [
        lp for e in events for c in e["choices"] if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]
    ]
    assert logprobs == choice["logprobs"]["token_logprobs"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": "1"}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1, "echo": True}, "max_tokens"),
    ],
)
def test_bad_prompt_logprobs_and_token_counts_are_400s_naming_the_field(server, body, field):
    response = httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT} | body, timeout=30
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field, response.text


def test_logit_bias_and_allowed_token_ids_choose_the_tokens(server):
    """OpenAI's logit_bias: 100 on a token makes the greedy completion that token; -100 on the
    greedy first token makes it another; keys are token ids written as strings. vLLM's
    allowed_token_ids: only those tokens are sampled."""
    url = server.url + "/v1/completions"
    ask = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "return_token_ids": True}
    greedy = httpx.post(url, json=ask, timeout=120).json()["choices"][0]["token_ids"]
    forced = httpx.post(url, json=ask | {"logit_bias": {"1000": 100}}, timeout=120).json()
    assert forced["choices"][0]["token_ids"] == [1000, 1000, 1000]
    banned = httpx.post(url, json=ask | {"logit_bias": {str(greedy[0]): -100}}, timeout=120).json()
    assert banned["choices"][0]["token_ids"][0] != greedy[0]
    allowed = httpx.post(
        url, json=ask | {"temperature": 1.0, "max_tokens": 8, "allowed_token_ids": [1000, 2000]}, timeout=120
    ).json()
    assert set(allowed["choices"][0]["token_ids"]) <= {1000, 2000}
    outside = httpx.post(url, json=ask | {"allowed_token_ids": [49152]}, timeout=30)
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "allowed_token_ids", (
        outside.text
    )
    for bias, words in [
        ({"blue": 5}, "token ids written as strings"),
        ({"49152": 5}, "outside the model's vocabulary"),
        ({str(i): 1 for i in range(301)}, "at most 300"),
    ]:
        refused = httpx.post(url, json=ask | {"logit_bias": bias}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "logit_bias", refused.text
        assert words in refused.json()["error"]["message"]


def test_bad_words_are_never_generated(server):
    """vLLM's bad_words: the greedy completion's second and third words, banned, do not come back
    as the tokens that spelled them; a word that spells nothing or too many words is a 400."""
    url = server.url + "/v1/completions"
    ask = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    greedy = httpx.post(url, json=ask, timeout=120).json()["choices"][0]
    words = greedy["text"].split()[1:3]
    assert len(words) == 2, greedy
    again = httpx.post(url, json=ask | {"bad_words": words}, timeout=120).json()["choices"][0]
    assert again["token_ids"] != greedy["token_ids"]

    def tokens(text):
        body = {"model": MODEL, "prompt": text, "add_special_tokens": False}
        return httpx.post(server.url + "/tokenize", json=body, timeout=30).json()["tokens"]

    spelled = [tokens(w) for w in words] + [tokens(" " + w) for w in words]
    out = again["token_ids"]
    assert any(s == greedy["token_ids"][i : i + len(s)] for s in spelled for i in range(12)), spelled
    assert not any(s == out[i : i + len(s)] for s in spelled for i in range(12)), (spelled, out)
    for bad_words in (["   "], ["w"] * 129):
        refused = httpx.post(url, json=ask | {"bad_words": bad_words}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "bad_words", refused.text


def test_only_requests_with_the_same_cache_salt_share_the_prefix_cache(server):
    """vLLM's cache_salt: a prompt another tenant sent is found in the prefix cache only under the
    same salt, so its cached prefix cannot be probed by timing from outside; an empty salt is a 400."""
    prompt = "Summarize the following report in one sentence. " * 8

    def hits_after(**salt):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1} | salt
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=120).status_code == 200
        return metric(server.url, "pagoda_prefix_cache_hits_total")

    before = hits_after(cache_salt="tenant-a")
    assert hits_after(cache_salt="tenant-b") == before
    assert hits_after() == before
    assert hits_after(cache_salt="tenant-a") >= before + 64
    empty = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "cache_salt": ""}
    response = httpx.post(server.url + "/v1/chat/completions", json=empty, timeout=30)
    assert response.status_code == 400 and "cache_salt" in response.text, response.text
    long = httpx.post(
        server.url + "/v1/chat/completions", json=empty | {"cache_salt": "s" * 1025}, timeout=30
    )
    assert long.status_code == 400 and "cache_salt" in long.text, long.text


def test_info_reports_the_bundled_model_as_loaded_on_the_cpu(server):
    info = httpx.get(server.url + "/v1/info", timeout=10).json()
    # With --dtype auto the CPU keeps the bundled Q4_1 projections packed (see quantization_selection.py):
    # 4 bits and a 16-bit scale and minimum per 32 weights, the norms float32, and the tied embedding
    # twice in float16: the lookup table, and the LM head's copy packed for fbgemm.
    assert (info["model"], info["quantization"], info["dtype"], info["kv_cache_dtype"]) == (
        MODEL,
        "gguf",
        "float32",
        "float32",
    )
    embedding, norms = 49_152 * 576, 61 * 576
    expected = (134_515_008 - embedding - norms) * 5 // 8 + 2 * 2 * embedding + 4 * norms
    assert info["weight_bytes"] == info["predicted_weight_bytes"] == expected
    per_block = 2 * 30 * 16 * 3 * 64 * 4  # keys and values, 30 layers, 16 tokens, 3 kv heads of 64, float32
    assert info["kv_bytes_per_block"] == per_block and info["num_kv_blocks"] == 200 * 2**20 // per_block
    assert info["kv_cache_bytes"] == per_block * info["num_kv_blocks"]
    assert f"memory: {MODEL}: quantization gguf" in server.log()


def test_raw_sse_framing(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(response.iter_bytes())
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert payloads[-1]["choices"][-1]["finish_reason"] in ("length", "stop")
    assert {p["id"] for p in payloads} == {payloads[0]["id"]}


def test_disconnect_mid_stream_frees_the_blocks(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert metric(server.url, "pagoda_num_requests_running") == 1
        assert metric(server.url, "pagoda_kv_cache_usage_ratio") > 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        # The readiness canary runs every second; look for the moment it is idle too.
        if (
            metric(server.url, "pagoda_num_requests_running") == 0
            and metric(server.url, "pagoda_kv_cache_usage_ratio") == 0
        ):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the disconnected request still holds KV blocks")
    assert metric(server.url, 'pagoda_requests_total{finish_reason="abort",model_name="smollm2-135m"}') >= 1


def patient(client):
    # These calls generate up to 40 tokens; a 2-core machine shared with other work can take seconds a token.
    return client.with_options(timeout=600)


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_response_format_whole_streamed_and_n2(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    messages = [{"role": "user", "content": "Invent a person."}]
    whole = patient(client).chat.completions.create(
        model=MODEL, messages=messages, response_format=fmt, max_tokens=40, n=2, temperature=1.0, seed=5
    )
    for choice in whole.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    stream = patient(client).chat.completions.create(
        model=MODEL, messages=messages, response_format=fmt, max_tokens=40, temperature=0, stream=True
    )
    text = "".join(c.delta.content or "" for chunk in stream for c in chunk.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_guided_choice_on_completions(client):
    result = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, extra_body={"guided_choice": ["red", "blue"]}
    )
    assert result.choices[0].text in ("red", "blue")


def test_required_tool_call_end_to_end(client):
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
            },
        },
    }
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    result = patient(client).chat.completions.create(
        model=MODEL, messages=messages, tools=[tool], tool_choice="required", max_tokens=40, temperature=0
    )
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    # The schema requires a city; like any JSON Schema without additionalProperties it allows more.
    assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments)["city"], str)
