"""Constrained decoding through the engine on a tiny random-weight model: whatever the weights
prefer, the text matches the constraint; unconstrained neighbours in the batch are unchanged."""

import json
import re

import jsonschema
import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.structured_outputs import StructuredOutputError, StructuredOutputs

from tests.runtime.tiny_models import build_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=[False, True], ids=["in-order", "async-scheduling"])
def llm(tmp_path_factory, request):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "smollm", "smollm")
    return LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        block_size=4,
        enable_prefix_caching=True,
        async_scheduling=request.param,
    )


def test_json_schema_holds_for_every_sample_while_free_neighbours_are_unchanged(llm):
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = llm.generate("Hello, world! How are", free)[0].outputs[0].token_ids
    constrained = SamplingParams(
        n=2,
        temperature=1.0,
        seed=3,
        max_tokens=80,
        structured_outputs=StructuredOutputs(json=json.dumps(SCHEMA)),
    )
    prompt = "The quick brown fox"
    # Twice, so that the second request's prompt comes from the prefix cache.
    outs = llm.generate([prompt, "Hello, world! How are", prompt], [constrained, free, constrained])
    assert outs[1].outputs[0].token_ids == alone
    assert outs[2].num_cached_tokens > 0
    for out in (outs[0], outs[2]):
        for sample in out.outputs:
            assert sample.finish_reason == "stop", sample.text
            jsonschema.validate(json.loads(sample.text), SCHEMA)


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        (StructuredOutputs(regex=r"[0-9]{3}-[a-z]{2}"), lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        (StructuredOutputs(choice=("red", "green", "blue")), lambda t: t in ("red", "green", "blue")),
        (StructuredOutputs(grammar='root ::= "yes" | "no"'), lambda t: t in ("yes", "no")),
        (StructuredOutputs(grammar='start: "x"+ "!"'), lambda t: re.fullmatch(r"x+!", t)),
    ],
)
def test_regex_choice_object_and_grammars(llm, spec, check):
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=60, structured_outputs=spec)
    text = llm.generate("def add(a, b):", params)[0].outputs[0].text
    assert check(text), text


def test_json_object_is_an_object_until_the_length_cuts_it(llm):
    params = SamplingParams(
        temperature=0.8, seed=2, max_tokens=40, structured_outputs=StructuredOutputs(json_object=True)
    )
    for sample in llm.generate("Once upon a time there", params)[0].outputs:
        assert sample.text.startswith("{")
        if sample.finish_reason == "stop":
            assert isinstance(json.loads(sample.text), dict)
        else:
            assert sample.finish_reason == "length" and len(sample.token_ids) == 40


def test_a_keyword_the_engine_cannot_enforce_is_named():
    with pytest.raises(StructuredOutputError, match='"uniqueItems"'):
        StructuredOutputs(json=json.dumps({"type": "array", "uniqueItems": True})).to_llguidance()


def test_offline_chat_renders_the_template_and_can_be_constrained(llm):
    conversation = [{"role": "user", "content": "Pick a colour."}]
    tokenizer = llm.get_tokenizer()
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    params = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputs(choice=("red", "blue")))
    [one] = llm.chat(conversation, params)
    assert one.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert one.outputs[0].text in ("red", "blue")
    assert len(llm.chat([conversation, conversation], params)) == 2
