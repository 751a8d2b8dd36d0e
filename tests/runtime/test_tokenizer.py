"""Tokenizers from GGUF metadata and HF folders, chat templates, and streaming detokenization."""

from __future__ import annotations

import pytest
from pagoda_runtime.contract.bundled import bundled_model_path
from pagoda_runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda_runtime.engine.tokenizer import ChatTemplateMissing, Tokenizer
from pagoda_runtime.loading.gguf_reader import GGUFFile
from transformers import AutoTokenizer

from tests.runtime.tiny_models import build_tiny_model

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\n\nruns",
    "Numbers 0 7 42 1234567890 3.14159 -2e10",
    "def f(x):\n    return {'a': [x, x ** 2]}  # comment",
    "Unicode: café naïve Straße Ærø façade",
    "CJK: 日本語のテキスト 中文 한국어",
    "Emoji: 🦜👍🏽🇫🇷❤️‍🔥 😀😀",
    "Mixed\u00a0spaces\u2009and\u200bzero width",
    "<|im_start|>user\nhi<|im_end|>",
    "",
    " ",
    "a" * 300,
]


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    path = bundled_model_path()
    return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, str(path))


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {v: build_tiny_model(root / v, v) for v in ("llama2", "llama3", "qwen2")}


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_tokenizer_round_trips_text(smollm, text):
    assert smollm.decode(smollm.encode(text), skip_special_tokens=False) == text


def test_gguf_tokenizer_knows_its_special_tokens(smollm):
    assert smollm.encode("<|im_start|>") == [1]
    assert smollm.encode("<|im_end|>") == [2]
    assert smollm.eos_token_ids == (2,)
    assert smollm.vocab_size == 49152
    assert smollm.decode(smollm.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"
    # What a decode that skips special tokens leaves out (the tool-call parsers ask it).
    assert {"<|im_start|>", "<|im_end|>"} <= smollm.special_tokens and "hi" not in smollm.special_tokens
    # SmolLM2's GGUF says add_bos_token = false.
    assert smollm.encode("hi")[0] != smollm.bos_token_id


@pytest.mark.slow
def test_gguf_tokenizer_ids_equal_transformers_gguf_conversion(smollm):
    path = bundled_model_path()
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        assert smollm.encode(text) == reference.encode(text), text


def test_bundled_chat_template_renders_chatml(smollm):
    rendered = smollm.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = smollm.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert with_system == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("variant", ["llama2", "llama3", "qwen2"])
def test_folder_tokenizer_matches_transformers(tiny_folders, variant):
    folder = tiny_folders[variant]
    ours = Tokenizer.from_folder(folder)
    reference = AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        ids = reference.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    messages = [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me a joke"},
    ]
    for prompt in (True, False):
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        assert ours.apply_chat_template(messages, add_generation_prompt=prompt) == expected


def test_model_without_chat_template_says_so(smollm):
    plain = Tokenizer(
        smollm.backend,
        source="plain.gguf",
        bos_token=None,
        eos_token=None,
        eos_token_ids=(),
        chat_template=None,
    )
    with pytest.raises(ChatTemplateMissing, match="plain.gguf has no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "hi"}])


def _stream(tokenizer, prompt_ids, ids, **kwargs):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, **kwargs)
    deltas, stop = [], None
    for token in ids:
        delta = detok.add_tokens([token])
        deltas.append(delta.text)
        if delta.stop is not None:
            stop = delta.stop
            break
    else:
        deltas.append(detok.finish())
    assert "".join(deltas) == detok.output_text
    return deltas, stop


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_decoded_text_and_never_breaks_a_character(smollm, text):
    prompt = smollm.encode("Say something:")
    ids = smollm.encode(text)
    deltas, stop = _stream(smollm, prompt, ids)
    assert stop is None
    assert "".join(deltas) == smollm.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_multibyte_characters_split_across_tokens_arrive_whole(smollm):
    ids = smollm.encode("🦜 parrot 👍🏽")
    assert len(ids) > 4  # the emoji are spread over several byte tokens
    deltas, _ = _stream(smollm, [], ids)
    assert [d for d in deltas if d] == ["🦜", " parrot", " 👍", "🏽"]


@pytest.mark.parametrize("variant", ["llama2", "llama3"])
def test_streamed_text_keeps_leading_spaces_of_sentencepiece_tokens(tiny_folders, variant):
    tokenizer = Tokenizer.from_folder(tiny_folders[variant])
    full = tokenizer.encode("The quick brown fox jumps over 😀 the lazy dog")
    prompt, generated = full[:4], full[4:]
    assert tokenizer.decode(full).startswith(tokenizer.decode(prompt))
    deltas, _ = _stream(tokenizer, prompt, generated)
    assert "".join(deltas) == tokenizer.decode(full)[len(tokenizer.decode(prompt)) :]


def test_stop_string_spanning_tokens_truncates_and_is_never_streamed(smollm):
    text = "The answer is 42. Observation: done"
    ids = smollm.encode(text)
    deltas, stop = _stream(smollm, [], ids, stop=["Observation:"])
    assert stop == "Observation:"
    assert "".join(deltas) == "The answer is 42. "
    assert not any("Obs" in d for d in deltas)


def test_stop_string_can_be_kept_and_the_earliest_stop_wins(smollm):
    ids = smollm.encode("alpha beta gamma delta")
    deltas, stop = _stream(smollm, [], ids, stop=["delta", "beta g"], include_stop_str_in_output=True)
    assert stop == "beta g"
    assert "".join(deltas) == "alpha beta g"


def test_partial_stop_is_held_back_then_released_when_it_does_not_complete(smollm):
    ids = smollm.encode("we said STO and then STOP")
    detok = IncrementalDetokenizer(smollm, [], stop=["STOP!"])
    streamed = ""
    for token in ids:
        delta = detok.add_tokens([token])
        streamed += delta.text
        assert delta.stop is None
        assert not streamed.endswith(("S", "ST", "STO", "STOP"))
    assert streamed + detok.finish() == "we said STO and then STOP"


def test_stop_inside_an_emoji_sequence_matches_on_whole_characters(smollm):
    ids = smollm.encode("ok 👍🏽 then")
    deltas, stop = _stream(smollm, [], ids, stop=["🏽"])
    assert stop == "🏽"
    assert "".join(deltas) == "ok 👍"
