"""Text <-> token ids and chat templates, for a Hugging Face folder or a GGUF file's metadata.

Both sources end up as one `tokenizers.Tokenizer` (the Rust fast tokenizer) plus the few facts the
engine needs around it: BOS/EOS ids and the chat template, rendered with jinja2 the way
transformers renders it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from pagoda_runtime.engine.tiktoken_folder import is_tiktoken_folder, tiktoken_tokenizer

_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# llama.cpp's `tokenizer.ggml.pre` names the pre-tokenizer regex the original tokenizer used.
_GGUF_PRE_TOKENIZERS = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_PATTERN),
    "qwen2": lambda: _split_then_bytes(_QWEN2_PATTERN),
}

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL = 3
_USER_DEFINED = 4


class ChatTemplateMissing(ValueError):
    pass


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        source: str,
        bos_token: str | None,
        eos_token: str | None,
        eos_token_ids: Sequence[int],
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self.chat_template = chat_template

    @classmethod
    def from_folder(cls, folder: str | Path, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        """`eos_token_ids`: the model's own (generation_config.json, config.json); without them, the
        tokenizer's eos token."""
        from transformers import AutoTokenizer

        folder = Path(folder)
        if is_tiktoken_folder(folder):
            return cls._from_tiktoken_folder(folder, eos_token_ids)
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{folder} has no tokenizer.json; Pagoda needs the fast tokenizer file next to config.json "
                "(or a Kimi tiktoken.model)"
            )
        # transformers reconciles tokenizer_config.json (add_bos_token, added tokens) with
        # tokenizer.json; we keep the Rust tokenizer it ends up with.
        hf = AutoTokenizer.from_pretrained(folder)
        template = hf.chat_template if isinstance(hf.chat_template, str) else None
        eos = list(eos_token_ids) or ([hf.eos_token_id] if hf.eos_token_id is not None else [])
        return cls(
            hf.backend_tokenizer,
            source=str(folder),
            bos_token=hf.bos_token,
            eos_token=hf.eos_token,
            eos_token_ids=eos,
            chat_template=template,
        )

    @classmethod
    def _from_tiktoken_folder(cls, folder: Path, eos_token_ids: Sequence[int]) -> Tokenizer:
        """A Kimi folder (tiktoken_folder.py): its tokens named in tokenizer_config.json, the chat
        template there or in chat_template.jinja; no BOS added, as tokenization_kimi.py adds none."""
        backend, config = tiktoken_tokenizer(folder)
        bos, eos = (_token_content(config.get(key)) for key in ("bos_token", "eos_token"))
        template = config.get("chat_template")
        if not isinstance(template, str) and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        eos_id = backend.token_to_id(eos) if eos else None
        return cls(
            backend,
            source=str(folder),
            bos_token=bos,
            eos_token=eos,
            eos_token_ids=list(eos_token_ids) or ([eos_id] if eos_id is not None else []),
            chat_template=template if isinstance(template, str) else None,
        )

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], source: str) -> Tokenizer:
        kind = metadata.get("tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre", "gpt2")
        if kind != "gpt2":
            raise ValueError(
                f"{source} has a {kind!r} tokenizer; "
                "Pagoda reads only byte-level BPE ('gpt2') tokenizers from GGUF"
            )
        if pre not in _GGUF_PRE_TOKENIZERS:
            raise ValueError(
                f"{source} uses the pre-tokenizer {pre!r}; "
                f"supported are {', '.join(sorted(_GGUF_PRE_TOKENIZERS))}"
            )
        tokens = list(metadata["tokenizer.ggml.tokens"])
        types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
        vocab = {token: i for i, token in enumerate(tokens)}
        backend = tokenizers.Tokenizer(
            models.BPE(vocab=vocab, merges=merges, ignore_merges=pre == "llama-bpe")
        )
        if pre == "qwen2":
            backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = _GGUF_PRE_TOKENIZERS[pre]()
        backend.decoder = decoders.ByteLevel()
        backend.add_tokens(
            [
                AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
                for i in range(len(tokens))
                if types[i] in (_CONTROL, _USER_DEFINED)
            ]
        )

        def token(key: str) -> str | None:
            index = metadata.get(key)
            return tokens[index] if index is not None and 0 <= index < len(tokens) else None

        bos = token("tokenizer.ggml.bos_token_id")
        if bos is not None and metadata.get("tokenizer.ggml.add_bos_token", False):
            bos_id = vocab[bos]
            backend.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
            )
        eos_keys = (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        )
        return cls(
            backend,
            source=source,
            bos_token=bos,
            eos_token=token("tokenizer.ggml.eos_token_id"),
            eos_token_ids=[metadata[k] for k in eos_keys if k in metadata],
            chat_template=metadata.get("tokenizer.chat_template"),
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def special_tokens(self) -> frozenset[str]:
        """The added tokens a decode with skip_special_tokens leaves out of the text."""
        return frozenset(t.content for t in self.backend.get_added_tokens_decoder().values() if t.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """Two texts as one input through the tokenizer's pair template, special tokens included
        (transformers' `tokenizer(text, text_pair)`): a cross-encoder's prompt."""
        return self.backend.encode(first, second).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if not self.chat_template:
            raise ChatTemplateMissing(
                f"the model {self.source} has no chat template; use the completions API with a plain "
                "prompt, or serve it with --chat-template"
            )
        return self._compiled_template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        # The same environment transformers gives chat templates, so templates written for it render alike.
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _token_content(token: str | Mapping[str, Any] | None) -> str | None:
    """tokenizer_config.json's bos_token or eos_token: a string, or an AddedToken's fields."""
    return token.get("content") if isinstance(token, Mapping) else token


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)
