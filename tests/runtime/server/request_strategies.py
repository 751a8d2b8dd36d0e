"""Hypothesis strategies for request bodies over every field of both generating endpoints (and
/tokenize, /detokenize): plausible values, then a few fields made wrong (types, values past the
engine's ranges, text with lone surrogates, nesting past the edge's limit, huge lists), unknown
fields, required fields dropped, and bodies that are not JSON at all.

Valid requests are kept cheap (at most 3 tokens, n <= 2 unless a wrong value says otherwise) so
that thousands of them stay short on a CPU. `structured_bodies` are valid requests with an output
constraint or tools, and `check_structured` says whether an answer obeys its constraint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema
from hypothesis import strategies as st

# The bundled model's vocabulary: ids around its end are where off-by-ones live.
VOCAB = 49_152
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Raw:
    """JSON text spliced into a body as it is: nesting too deep for json.dumps to write."""

    text: str


def encode(body: Any) -> bytes:
    """The body as JSON bytes, Raw parts spliced in, lone surrogates as \\u escapes (valid JSON)."""
    raws: list[str] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(body))
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@raw{i}@@"', raw, 1)
    return text.encode()


# Any text, lone UTF-16 surrogates included (which no tokenizer takes).
text = st.text(st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=12)
boundary_ints = st.sampled_from(
    [-1, 0, 1, 3, VOCAB - 1, VOCAB, INT32_MAX, INT32_MAX + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]
)
ints = st.one_of(boundary_ints, st.integers(), st.integers(min_value=-(2**70), max_value=2**70))
floats = st.one_of(st.floats(), st.sampled_from([-0.0, 1e-300, 2.0000001, 1e308]))
junk = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    floats,
    text,
    st.lists(st.integers(-3, 70000), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
deep = st.sampled_from([63, 64, 65, 200, 960, 5000]).flatmap(
    lambda depth: st.sampled_from([Raw("[" * depth + "]" * depth), Raw('{"a":' * depth + "1" + "}" * depth)])
)
huge_list = st.builds(
    lambda n, item: [item] * n,
    st.sampled_from([1000, 50_000]),
    st.sampled_from([0, 1, VOCAB, -1, "a", "\ud800", None, {}, [1]]),
)
huge_text = st.builds(
    lambda n, c: c * n, st.sampled_from([10_000, 300_000]), st.sampled_from(["a", "é ", "["])
)
# What a client might send for a field instead of what it should.
wrong = st.one_of(junk, junk, junk, deep, huge_list, huge_text)

# Small JSON schemas, some with keywords the grammar engine refuses (uniqueItems, not).
_schema = st.one_of(
    st.just({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    st.just({"type": "string", "maxLength": 3}),
    st.just({"enum": ["x", "y"]}),
    st.just({"type": "array", "uniqueItems": True}),
    st.just({"not": {"type": "string"}}),
    st.dictionaries(st.sampled_from(["type", "minimum", "pattern", "$ref", "properties"]), junk, max_size=2),
)
_regex = st.one_of(st.sampled_from(["[0-9]", "a|b", "[a-", "(x", "\\d{2}", "(a*)*b"]), text)
_choice = st.lists(text, max_size=3)
_grammar = st.one_of(st.sampled_from(['root ::= "a" | "b"', 'start: "x"', "root ::= ((", ""]), text)
_structured = st.one_of(
    st.fixed_dictionaries(
        {}, optional={"json": _schema, "regex": _regex, "choice": _choice, "grammar": _grammar}
    ),
    st.fixed_dictionaries({"json_object": st.booleans()}),
    st.fixed_dictionaries({"whitespace_pattern": text}),
)
_response_format = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])}),
    st.fixed_dictionaries(
        {
            "type": st.just("json_schema"),
            "json_schema": st.fixed_dictionaries(
                {"name": st.sampled_from(["x", "a b", ""])},
                optional={"schema": _schema, "strict": st.booleans(), "description": text},
            ),
        }
    ),
)
_token_ids = st.lists(st.one_of(st.integers(0, VOCAB - 1), boundary_ints), max_size=4)
_sampling = {
    "model": st.none(),  # the served name is the body's base; a wrong one is a 404
    "n": st.integers(1, 2),
    "temperature": st.one_of(st.floats(0, 2), st.just(0)),
    "top_p": st.floats(0.01, 1),
    "seed": st.one_of(st.integers(-(2**63), 2**63 - 1), boundary_ints),
    "stop": st.one_of(text, st.lists(text, max_size=5)),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "user": text,
    "logit_bias": st.dictionaries(
        st.sampled_from(["5", "49152", "-1", "x"]), st.floats(-100, 100), max_size=2
    ),
    "top_k": st.one_of(st.integers(-1, 60), boundary_ints),
    "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0.01, 2),
    "min_tokens": st.integers(0, 3),
    "ignore_eos": st.booleans(),
    "priority": st.one_of(st.integers(-3, 3), boundary_ints),
    "cache_salt": st.one_of(text, st.integers(0, 3)),
    "prompt_logprobs": st.one_of(st.integers(0, 3), boundary_ints, text),
    "skip_special_tokens": st.booleans(),
    "allowed_token_ids": st.one_of(st.lists(st.one_of(st.integers(0, 60), boundary_ints), max_size=3), wrong),
    "return_token_ids": st.booleans(),
    "return_tokens_as_token_ids": st.one_of(st.none(), st.booleans()),
    "truncate_prompt_tokens": st.one_of(st.integers(-1, 8), boundary_ints),
    "truncation_side": st.sampled_from(["left", "right", "middle"]),
    "use_beam_search": st.booleans(),
    "bad_words": st.lists(text, max_size=1),
    "stop_token_ids": _token_ids,
    "include_stop_str_in_output": st.booleans(),
    "response_format": _response_format,
    "structured_outputs": _structured,
    "guided_json": _schema,
    "guided_regex": _regex,
    "guided_choice": _choice,
    "guided_grammar": _grammar,
}
COMPLETION_FIELDS = {
    **_sampling,
    "max_tokens": st.integers(0, 3),
    "logprobs": st.one_of(st.integers(0, 5), boundary_ints),
    "echo": st.booleans(),
    "add_special_tokens": st.booleans(),
    "suffix": st.one_of(st.none(), text),
    "best_of": st.integers(1, 3),
    "prompt": st.one_of(
        text.filter(bool),
        st.lists(st.one_of(st.integers(0, VOCAB - 1), boundary_ints), min_size=1, max_size=6),
        st.lists(text, min_size=1, max_size=2),
        st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=4), min_size=1, max_size=2),
    ),
}
_tool_call = st.fixed_dictionaries(
    {
        "id": text,
        "type": st.sampled_from(["function", "other"]),
        "function": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["get_weather", "f", ""]),
                "arguments": st.sampled_from(['{"city": "x"}', "{", "", "[[[["]),
            }
        ),
    }
)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "bot"]),
        "content": st.one_of(
            st.none(),
            text,
            st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": text})),
        ),
    },
    optional={"tool_call_id": text, "tool_calls": st.lists(_tool_call, max_size=2), "name": text},
)
_tool = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "function", "custom"]),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["get_weather", "f", "bad name", "x" * 65])},
            optional={"description": text, "parameters": _schema, "strict": st.booleans()},
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
# vLLM's chat-template options (the chat endpoint's and /tokenize's): template variables, reserved
# names among them, a template of the request's own.
_CHAT_TEMPLATE = {
    "add_generation_prompt": st.booleans(),
    "continue_final_message": st.booleans(),
    "chat_template_kwargs": st.dictionaries(
        st.sampled_from(["enable_thinking", "messages", "bos_token", "x"]),
        st.one_of(st.booleans(), text),
        max_size=2,
    ),
    "chat_template": st.one_of(st.none(), text),
    "documents": st.lists(st.dictionaries(st.sampled_from(["title", "text"]), text, max_size=2), max_size=1),
    "reasoning_effort": st.sampled_from(["none", "low", "high", "extreme"]),
}
CHAT_FIELDS = {
    **_sampling,
    "messages": st.lists(_message, min_size=1, max_size=3),
    "max_tokens": st.integers(1, 3),
    "max_completion_tokens": st.integers(1, 3),
    "logprobs": st.booleans(),
    "include_reasoning": st.booleans(),
    "top_logprobs": st.one_of(st.integers(0, 20), boundary_ints),
    "tools": st.lists(_tool, max_size=2),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": st.booleans(),
    "functions": st.lists(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=1), max_size=1),
    **_CHAT_TEMPLATE,
    "echo": st.booleans(),
}
# Token limits a wrong value may set: past the context (a 400), or at most 3 (cheap); likewise n,
# whose valid values up to 128 cost as many sequences.
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_CHEAPER = {
    "max_tokens": (range(4, 5000), 3),
    "max_completion_tokens": (range(4, 5000), 3),
    "max_output_tokens": (range(4, 5000), 3),
    "n": (range(3, 129), 2),
}


def _body(model: str, fields: dict, required: list[str], limit: str = "max_tokens"):
    valid = st.fixed_dictionaries(
        {"model": st.just(model), **{k: fields[k] for k in required}},
        optional={k: v for k, v in fields.items() if k not in required and k != "model"},
    )
    names = st.sampled_from(sorted(fields))
    changes = st.dictionaries(names, st.one_of(wrong, st.sampled_from([model, "other-model"])), max_size=3)
    unknown = st.dictionaries(st.text(max_size=6), junk, max_size=2)
    dropped = st.sets(st.sampled_from(["model", *required]), max_size=1)

    def build(parts) -> bytes:
        body, changed, extra, drop = parts
        body = {**extra, **body, **changed}
        for name in drop:
            body.pop(name, None)
        for name, (costly, cheap) in _CHEAPER.items():
            if type(body.get(name)) is int and body[name] in costly:
                body[name] = cheap
        if not any(name in body for name in _TOKEN_LIMITS):
            body[limit] = 2  # else a chat completion may fill the whole context
        return encode(body)

    return st.tuples(valid, changes, unknown, dropped).map(build)


_response_item = st.one_of(
    _message.map(lambda m: {k: v for k, v in m.items() if k in ("role", "content")}),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": text,
            "name": st.sampled_from(["get_weather", ""]),
            "arguments": st.sampled_from(['{"city": "x"}', "{"]),
        }
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text, "output": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "input_image", "other"])}),
)
RESPONSES_FIELDS = {
    "input": st.one_of(text, st.lists(_response_item, max_size=3)),
    "instructions": st.one_of(st.none(), text),
    "max_output_tokens": st.one_of(st.integers(0, 3), boundary_ints),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "stream": st.booleans(),
    "tools": st.lists(
        st.one_of(
            _tool.map(
                lambda t: {"type": t["type"], **t["function"]} if isinstance(t.get("function"), dict) else t
            ),
            st.just({"type": "web_search"}),
        ),
        max_size=2,
    ),
    "tool_choice": st.one_of(
        st.sampled_from(["none", "auto", "required", "bogus"]),
        st.fixed_dictionaries(
            {"type": st.just("function"), "name": st.sampled_from(["get_weather", "nope"])}
        ),
    ),
    "parallel_tool_calls": st.booleans(),
    "text": st.fixed_dictionaries(
        {
            "format": st.one_of(
                st.just({"type": "text"}), st.just({"type": "json_object"}), st.just({"type": "json_schema"})
            )
        }
    ),
    "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["none", "low", "high", "huge"])}),
    "metadata": st.dictionaries(st.text(max_size=4), text, max_size=2),
    "store": st.booleans(),
    "previous_response_id": st.one_of(st.none(), text),
    "include": st.lists(st.sampled_from(["message.output_text.logprobs"]), max_size=1),
    "priority": st.one_of(st.integers(-3, 3), boundary_ints),
    "user": text,
    "truncation": st.sampled_from(["disabled", "auto"]),
}

_tokenize = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["fake-model", "smollm2-135m", "other"]),
        "prompt": st.one_of(text, wrong),
        "messages": st.one_of(st.lists(_message, max_size=2), wrong),
        "tools": st.lists(_tool, max_size=1),
        "add_special_tokens": st.one_of(st.booleans(), junk),
        "return_token_strs": st.one_of(st.booleans(), junk),
        **_CHAT_TEMPLATE,
    },
)
_detokenize = st.fixed_dictionaries(
    {"tokens": st.one_of(st.lists(st.one_of(st.integers(-2, 70000), boundary_ints), max_size=5), wrong)}
)
_ids = st.lists(st.one_of(st.integers(-2, 70000), boundary_ints), max_size=5)
EMBEDDING_FIELDS = {
    "model": st.sampled_from(["fake-model", "smollm2-135m", "other"]),
    "input": st.one_of(text, st.lists(text, max_size=3), _ids, st.lists(_ids, max_size=2), wrong),
    "encoding_format": st.one_of(st.sampled_from(["float", "base64", "int8"]), junk),
    "dimensions": st.one_of(st.none(), st.integers(-1, 8), junk),
    "user": text,
    "add_special_tokens": st.one_of(st.booleans(), junk),
    "truncate_prompt_tokens": st.one_of(st.integers(-1, 4), boundary_ints, junk),
    "truncation_side": st.one_of(st.sampled_from(["left", "right", "middle"]), junk),
}
_embeddings = st.fixed_dictionaries({}, optional=EMBEDDING_FIELDS)
_texts = st.one_of(text, st.lists(text, max_size=4), wrong)
_TRUNCATION = {name: EMBEDDING_FIELDS[name] for name in ("truncate_prompt_tokens", "truncation_side")}
SCORE_FIELDS = {"model": EMBEDDING_FIELDS["model"], "text_1": _texts, "text_2": _texts, **_TRUNCATION}
RERANK_FIELDS = {
    "model": EMBEDDING_FIELDS["model"],
    "query": st.one_of(text, wrong),
    "documents": _texts,
    "top_n": st.one_of(st.integers(-1, 5), boundary_ints, junk),
    "return_documents": st.one_of(st.booleans(), junk),
    **_TRUNCATION,
}
CLASSIFY_FIELDS = {
    name: EMBEDDING_FIELDS[name]
    for name in ("model", "input", "user", "add_special_tokens", "truncate_prompt_tokens", "truncation_side")
}


def request_bodies(model: str):
    """(path, raw body) pairs for the generating endpoints and /tokenize, /detokenize, including
    bodies that are not JSON at all."""
    paths = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/score",
        "/v1/rerank",
        "/classify",
        "/tokenize",
        "/detokenize",
    ]
    return st.one_of(
        st.tuples(st.just("/v1/responses"), _body(model, RESPONSES_FIELDS, ["input"], "max_output_tokens")),
        st.tuples(st.just("/v1/completions"), _body(model, COMPLETION_FIELDS, ["prompt"])),
        st.tuples(st.just("/v1/completions"), _body(model, COMPLETION_FIELDS, ["prompt"])),
        st.tuples(st.just("/v1/chat/completions"), _body(model, CHAT_FIELDS, ["messages"])),
        st.tuples(st.just("/v1/chat/completions"), _body(model, CHAT_FIELDS, ["messages"])),
        st.tuples(st.just("/v1/embeddings"), _embeddings.map(encode)),
        st.tuples(st.just("/score"), st.fixed_dictionaries({}, optional=SCORE_FIELDS).map(encode)),
        st.tuples(
            st.sampled_from(["/rerank", "/v2/rerank"]),
            st.fixed_dictionaries({}, optional=RERANK_FIELDS).map(encode),
        ),
        st.tuples(st.just("/classify"), st.fixed_dictionaries({}, optional=CLASSIFY_FIELDS).map(encode)),
        st.tuples(st.just("/tokenize"), _tokenize.map(encode)),
        st.tuples(st.just("/detokenize"), _detokenize.map(encode)),
        st.tuples(st.sampled_from(paths), st.binary(max_size=30)),
        st.tuples(st.sampled_from(paths), deep.map(encode)),
    )


def check_response(status: int, content_type: str, body: bytes) -> None:
    """No 5xx, errors in OpenAI's shape, streams complete and without an error event."""
    assert status < 500, body[:500]
    if status != 200:
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"]
    elif content_type.startswith("text/event-stream"):
        assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
        assert b'"error":{' not in body, body[-500:]  # a Responses event carries "error":null
    else:
        answer = json.loads(body)
        assert (
            answer.get("choices")
            or answer.get("object") == "response"
            or "tokens" in answer
            or "prompt" in answer
        ), answer


# ---- valid requests with an output constraint or tools -----------------------------------------

_name = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True)
_leaf = st.one_of(
    st.just({"type": "string", "maxLength": 6}),
    st.just({"type": "integer", "minimum": 0, "maximum": 99}),
    st.just({"type": "boolean"}),
    st.lists(st.from_regex(r"[a-z]{1,5}", fullmatch=True), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
)


def _object(properties) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


_object_schema = st.dictionaries(_name, _leaf, min_size=1, max_size=3).map(_object)
schemas = st.one_of(_leaf, _object_schema, st.dictionaries(_name, _object_schema, max_size=2).map(_object))
_regexes = st.sampled_from(["[0-9]{1,3}", "(yes|no)", "[a-z]{2,5}!", "\\d+-\\d+"])
_words = st.lists(st.from_regex(r"[A-Za-z]{1,8}", fullmatch=True), min_size=1, max_size=4, unique=True)
_prompts = st.sampled_from(
    ["Describe a cat.", "What is the weather in Paris?", "Pick one.", "Give me some JSON.", "Hello"]
)


@dataclass(frozen=True)
class Constrained:
    """One valid constrained request and what obeying its constraint means."""

    path: str
    body: dict
    kind: str  # "json", "choice", "regex", "tools", "named_tool"
    spec: Any  # the schema, the choices, the regex, or {tool name: parameters schema}


def _sampling_of(draw) -> dict:
    greedy = draw(st.booleans())
    return {
        "max_tokens": draw(st.integers(1, 16)),
        "temperature": 0 if greedy else 1.0,
        "seed": draw(st.integers(0, 1000)),
        "n": 1 if greedy else draw(st.integers(1, 2)),
        "stream": draw(st.booleans()),
    }


@st.composite
def structured_bodies(draw, model: str):
    """A valid request with an output constraint or tools, on either endpoint."""
    kind = draw(st.sampled_from(["json", "choice", "regex", "tools", "named_tool"]))
    sampling = _sampling_of(draw)
    prompt = draw(_prompts)
    chat = kind in ("tools", "named_tool") or draw(st.booleans())
    body: dict = {"model": model, **sampling}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if kind == "json":
        spec = draw(schemas)
        field = draw(st.sampled_from(["response_format", "structured_outputs", "guided_json"]))
        if field == "response_format":
            body[field] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": spec}}
        else:
            body[field] = {"json": spec} if field == "structured_outputs" else spec
    elif kind == "choice":
        spec = draw(_words)
        body[draw(st.sampled_from(["guided_choice", "structured_outputs"]))] = spec
        if "structured_outputs" in body:
            body["structured_outputs"] = {"choice": spec}
    elif kind == "regex":
        spec = draw(_regexes)
        body["guided_regex"] = spec
    else:
        names = draw(st.lists(_name, min_size=1, max_size=3, unique=True))
        spec = {name: draw(_object_schema) for name in names}
        body["tools"] = [
            {"type": "function", "function": {"name": n, "parameters": p}} for n, p in spec.items()
        ]
        if kind == "tools":
            body["tool_choice"] = "required"
            body["parallel_tool_calls"] = draw(st.booleans())
        else:
            named = draw(st.sampled_from(names))
            body["tool_choice"] = {"type": "function", "function": {"name": named}}
            spec = {named: spec[named]}
    return Constrained("/v1/chat/completions" if chat else "/v1/completions", body, kind, spec)


def _choices_of(status: int, content_type: str, raw: bytes, chat: bool) -> list[dict]:
    """Each choice's whole answer: text (or message), finish_reason, from a whole or streamed response."""
    if not content_type.startswith("text/event-stream"):
        return json.loads(raw)["choices"]
    merged: dict[int, dict] = {}
    for event in raw.decode().split("\n\n"):
        if not event.startswith("data: {"):
            continue
        for choice in json.loads(event.removeprefix("data: ")).get("choices", []):
            into = merged.setdefault(choice["index"], {"text": "", "tool_calls": {}, "finish_reason": None})
            into["finish_reason"] = choice.get("finish_reason") or into["finish_reason"]
            delta = choice.get("delta", {}) if chat else {"content": choice.get("text")}
            into["text"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                part = into["tool_calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                part["name"] += call["function"].get("name") or ""
                part["arguments"] += call["function"].get("arguments") or ""
    return [
        {
            "finish_reason": c["finish_reason"],
            "text": c["text"],
            "message": {
                "content": c["text"],
                "tool_calls": [{"function": f} for f in c["tool_calls"].values()],
            },
        }
        for _, c in sorted(merged.items())
    ]


def check_structured(request: Constrained, status: int, content_type: str, raw: bytes) -> None:
    """A valid constrained request is answered, and every answer that ended by itself obeys its
    constraint (one cut by max_tokens may stop anywhere)."""
    assert status == 200, raw[:500]
    check_response(status, content_type, raw)
    chat = request.path.endswith("chat/completions")
    for choice in _choices_of(status, content_type, raw, chat):
        text = choice["message"]["content"] if chat else choice["text"]
        if choice["finish_reason"] == "length":
            continue
        if request.kind == "json":
            jsonschema.validate(json.loads(text), request.spec)
        elif request.kind == "choice":
            assert text in request.spec, (text, request.spec)
        elif request.kind == "regex":
            assert re.fullmatch(request.spec, text), (text, request.spec)
        else:
            calls = [c["function"] for c in choice["message"]["tool_calls"] or ()]
            assert calls, choice
            for call in calls:
                jsonschema.validate(json.loads(call["arguments"]), request.spec[call["name"]])
