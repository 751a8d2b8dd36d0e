"""Kimi K2's tokenizer folder (tiktoken.model, tokenizer_config.json naming TikTokenTokenizer, no
tokenizer.json): read without running the checkpoint's tokenization_kimi.py, it encodes every text
as the tiktoken library does with Kimi's pattern and the same ranks (a tiny vocabulary trained in
the test on English, Chinese, digits and punctuation), numbers its special tokens as
tokenization_kimi.py does, and serves a model through the engine and its chat template."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import tiktoken
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.tiktoken_folder import KIMI_PATTERN, NUM_RESERVED_SPECIAL_TOKENS, read_ranks
from pagoda_runtime.engine.tokenizer import Tokenizer
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.runtime.tiny_models import build_tiny_model

CORPUS = [
    "The Quick brown fox's tail, the DOG'S bark: 12345 apples and 678 pears.",
    "我们今天去北京。中文分词和English混合在一起, 以及数字2024年。",
    "def add(a, b):\n    return a + b  # it's 3x faster\n\n\tTabs and  spaces!",
    "Ünïcödé naïve café — résumé; ÀÉÎÕÜ Straße 42nd",
] * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>{% endif %}"
)
NAMED = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>"]


def _trained_ranks() -> dict[bytes, int]:
    """A byte-level BPE of 256 bytes and 200 merges, ranked in the order its merges were learned
    (what tiktoken's ranks mean)."""
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=456, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(CORPUS, trainer)
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    return {bytes(to_byte[c] for c in token): rank for token, rank in backend.get_vocab().items()}


def write_kimi_tokenizer(folder: Path, ranks: dict[bytes, int]) -> Path:
    """Kimi K2's tokenizer files: the ranks, and tokenizer_config.json naming some special ids."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        f"{base64.b64encode(token).decode()} {rank}"
        for token, rank in sorted(ranks.items(), key=lambda x: x[1])
    ]
    (folder / "tiktoken.model").write_text("\n".join(lines) + "\n")
    first = len(ranks)
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": {"content": "[EOS]", "special": True},
        "added_tokens_decoder": {
            str(first + i): {"content": name, "special": True} for i, name in enumerate(NAMED)
        },
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    ranks = _trained_ranks()
    folder = write_kimi_tokenizer(tmp_path_factory.mktemp("kimi"), ranks)
    first = len(ranks)
    special = {f"<|reserved_token_{i}|>": i for i in range(first, first + NUM_RESERVED_SPECIAL_TOKENS)}
    special |= {name: first + i for i, name in enumerate(NAMED)}
    reference = tiktoken.Encoding(
        "kimi-tiny", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=special
    )
    return folder, Tokenizer.from_folder(folder), reference, first


TEXTS = st.text(
    alphabet=st.sampled_from(list("aZqX'sdtTlLmMvVe 世界中文北京你好\n\t\r0123456789.,;:!?-_()[]éÀß\u0301 ")),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(text=TEXTS)
def test_every_text_encodes_as_tiktoken_encodes_it(kimi, text):
    _, tokenizer, reference, _ = kimi
    ids = tokenizer.encode(text)
    assert ids == reference.encode_ordinary(text)
    assert tokenizer.decode(ids) == text


def test_the_pattern_splits_han_from_latin_and_digits_in_threes(kimi):
    """Kimi's pattern and not the GPT-4 one it resembles: a Han run is a piece of its own even next to
    Latin letters, and numbers split every three digits."""
    _, tokenizer, reference, _ = kimi
    for text in ("Hello世界ABCdef", "中文English中文", "1234567 it's DOG'S", "北京2024年"):
        assert tokenizer.encode(text) == reference.encode_ordinary(text)
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    pieces = [
        bytes(to_byte[c] for c in piece).decode()
        for piece, _ in tokenizer.backend.pre_tokenizer.pre_tokenize_str("Hello世界ABCdef 1234567")
    ]
    assert pieces == ["Hello", "世界", "ABCdef", " ", "123", "456", "7"]


def test_special_tokens_are_numbered_as_tokenization_kimi_numbers_them(kimi):
    folder, tokenizer, reference, first = kimi
    assert tokenizer.vocab_size == first + NUM_RESERVED_SPECIAL_TOKENS
    assert tokenizer.eos_token_ids == (first + 1,) and tokenizer.bos_token_id == first
    text = "<|im_user|>hi<|im_end|><|im_assistant|>"
    assert tokenizer.encode(text) == reference.encode(text, allowed_special="all")
    assert tokenizer.encode(f"<|reserved_token_{first + 10}|>") == [first + 10]
    last = first + NUM_RESERVED_SPECIAL_TOKENS - 1
    assert tokenizer.backend.id_to_token(last) == f"<|reserved_token_{last}|>"
    assert tokenizer.decode(tokenizer.encode(text)) == "hi"
    assert "<|im_end|>" in tokenizer.special_tokens


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokenizer_class": "GPT2Tokenizer"}, "tokenizer_class is 'GPT2Tokenizer'"),
        ({"added_tokens_decoder": {"7": {"content": "<x>"}}}, "names special token id 7, outside"),
    ],
)
def test_a_tiktoken_folder_that_is_not_kimis_is_refused_naming_why(kimi, tmp_path, change, message):
    folder = kimi[0]
    (tmp_path / "tiktoken.model").write_bytes((folder / "tiktoken.model").read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text()) | change
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_folder(tmp_path)


def test_a_ranks_file_with_a_gap_is_refused(tmp_path):
    (tmp_path / "f").write_text(f"{base64.b64encode(b'a').decode()} 0\n{base64.b64encode(b'b').decode()} 2\n")
    with pytest.raises(ValueError, match="does not rank its tokens 0 to 1 once each"):
        read_ranks(tmp_path / "f")


def test_a_model_with_kimis_tokenizer_serves_completions_and_chat(kimi, tmp_path):
    """A tiny DeepSeek V3 (Kimi K2's architecture) whose folder holds Kimi's tokenizer files instead
    of tokenizer.json: the engine encodes prompts as tiktoken does, renders the chat template with
    its special tokens, and generates."""
    folder, _, reference, first = kimi
    model = build_tiny_model(tmp_path / "model", "deepseek_v3")
    config = AutoConfig.from_pretrained(model)
    config.vocab_size = first + NUM_RESERVED_SPECIAL_TOKENS
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (model / name).unlink(missing_ok=True)
    for name in ("tiktoken.model", "tokenizer_config.json"):
        (model / name).write_bytes((folder / name).read_bytes())
    llm = LLM(str(model), dtype="float32", device="cpu")
    prompt = "我们今天 went to 北京, it's 2024!"
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    assert out.prompt_token_ids == reference.encode_ordinary(prompt)
    assert len(out.outputs[0].token_ids) == 8
    chat = llm.chat([{"role": "user", "content": "你好"}], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    expected = reference.encode("<|im_user|>你好<|im_end|><|im_assistant|>", allowed_special="all")
    assert chat.prompt_token_ids == expected
