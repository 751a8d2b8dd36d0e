"""Conversations to prompt ids with vLLM's chat-template options: the same text transformers renders
(its continue_final_message, a template's own variables), and each misuse a ChatPromptError naming
the request field."""

import pytest
from pagoda_runtime.engine.chat_prompt import ChatPromptError, chat_prompt_ids
from pagoda_runtime.engine.tokenizer import Tokenizer
from transformers import AutoTokenizer

from tests.runtime.tiny_models import build_tiny_model

PREFILLED = [
    {"role": "user", "content": "Write a haiku about autumn."},
    {"role": "assistant", "content": "Leaves drift on the "},
]
# A template that reads a variable of its own, as Qwen 3's reads enable_thinking.
THINKING_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def tokenizers(request, tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("chat") / request.param, request.param)
    return Tokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder), folder


def test_a_continued_final_message_ends_where_its_text_ends_as_in_transformers(tokenizers):
    ours, reference, _ = tokenizers
    expected = reference.apply_chat_template(
        PREFILLED, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    ids = chat_prompt_ids(ours, PREFILLED, add_generation_prompt=False, continue_final_message=True)
    assert ids == reference.encode(expected, add_special_tokens=False)
    # (Llama 3's template trims a message: the trimmed text is what goes on.)
    assert ours.decode(ids, skip_special_tokens=False).rstrip().endswith("Leaves drift on the")
    closed = chat_prompt_ids(ours, PREFILLED, add_generation_prompt=False)
    assert len(closed) > len(ids) and closed[: len(ids)] == ids  # the end of turn is what is left out


def test_template_variables_reach_the_template_as_in_transformers(tokenizers):
    _, reference, folder = tokenizers
    ours = Tokenizer.from_folder(folder)
    ours.chat_template = THINKING_TEMPLATE  # as the server's --chat-template sets it
    question = PREFILLED[:1]
    for variables in ({"enable_thinking": False}, {"enable_thinking": True}, {}):
        expected = reference.apply_chat_template(
            question, chat_template=THINKING_TEMPLATE, tokenize=False, add_generation_prompt=True, **variables
        )
        ids = chat_prompt_ids(ours, question, template_kwargs=variables)
        assert ours.decode(ids, skip_special_tokens=False) == expected
    assert "<think></think>" in ours.decode(
        chat_prompt_ids(ours, question, template_kwargs={"enable_thinking": False})
    )
    # OpenAI's reasoning_effort "none" turns thinking off, unless the template's variable is given.
    assert "<think></think>" in ours.decode(chat_prompt_ids(ours, question, reasoning_effort="none"))
    assert "<think>" not in ours.decode(chat_prompt_ids(ours, question, reasoning_effort="high"))
    kept_on = chat_prompt_ids(
        ours, question, reasoning_effort="none", template_kwargs={"enable_thinking": True}
    )
    assert "<think>" not in ours.decode(kept_on)


@pytest.mark.parametrize(
    ("options", "param", "words"),
    [
        (dict(continue_final_message=True), "continue_final_message", "add_generation_prompt to false"),
        (
            dict(template_kwargs={"messages": [], "bos_token": "x"}),
            "chat_template_kwargs",
            "bos_token, messages",
        ),
    ],
)
def test_conflicting_options_name_the_field(tokenizers, options, param, words):
    with pytest.raises(ChatPromptError, match=words) as refused:
        chat_prompt_ids(tokenizers[0], PREFILLED, **options)
    assert refused.value.param == param


def test_a_final_message_without_text_cannot_be_continued(tokenizers):
    empty = [PREFILLED[0], {"role": "assistant", "content": ""}]
    with pytest.raises(ChatPromptError, match="give the final message some content") as refused:
        chat_prompt_ids(tokenizers[0], empty, add_generation_prompt=False, continue_final_message=True)
    assert refused.value.param == "continue_final_message"
