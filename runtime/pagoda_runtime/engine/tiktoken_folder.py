"""A Kimi tokenizer folder (tiktoken.model and no tokenizer.json) as a fast tokenizer.

Moonshot's Kimi K2 checkpoints (K2-Instruct, K2-Thinking; Moonlight too) ship their vocabulary as a
tiktoken BPE ranks file and a tokenization_kimi.py that transformers runs only with
trust_remote_code (vLLM runs it so). Pagoda runs no code from a checkpoint: the ranks are read here
(a base64 token and its rank a line), turned into byte-level BPE merges by transformers'
TikTokenConverter, split by tokenization_kimi.py's pattern, and followed by the special tokens as
tokenization_kimi.py numbers them: num_reserved_special_tokens ids after the vocabulary, each named
by tokenizer_config.json's added_tokens_decoder where it lists the id, `<|reserved_token_{id}|>`
where not.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

RANKS_FILE = "tiktoken.model"
# tokenizer_config.json's tokenizer_class of the folders whose pattern and numbering are Kimi's.
KIMI_TOKENIZER_CLASS = "TikTokenTokenizer"
NUM_RESERVED_SPECIAL_TOKENS = 256
# tokenization_kimi.py's pat_str: Han runs apart from other letters (class intersection, which the
# fast tokenizer's Oniguruma regex reads as tiktoken's does), English contractions, digits in threes.
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


def is_tiktoken_folder(folder: Path) -> bool:
    return (folder / RANKS_FILE).is_file() and not (folder / "tokenizer.json").is_file()


def read_ranks(file: Path) -> dict[bytes, int]:
    """The ranks file: one base64 token and its rank a line, as tiktoken writes it."""
    ranks = {}
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise ValueError(f"{file} line {number} is not a base64 token and its rank: {exc}") from exc
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{file} does not rank its tokens 0 to {len(ranks) - 1} once each")
    return ranks


def tiktoken_tokenizer(folder: Path) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
    """The folder's fast tokenizer and its tokenizer_config.json; ValueError where the folder is no
    Kimi tokenizer (its pattern and special-token numbering are the only ones known here)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if config.get("tokenizer_class") != KIMI_TOKENIZER_CLASS:
        raise ValueError(
            f"{folder} holds a tiktoken vocabulary whose tokenizer_class is "
            f"{config.get('tokenizer_class')!r}; Pagoda reads Kimi's ({KIMI_TOKENIZER_CLASS}) and "
            "tokenizer.json folders: add the model's tokenizer.json"
        )
    ranks = read_ranks(folder / RANKS_FILE)

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    backend = Converter(vocab_file=str(folder / RANKS_FILE), pattern=KIMI_PATTERN).converted()
    named = {int(i): entry["content"] for i, entry in (config.get("added_tokens_decoder") or {}).items()}
    first = len(ranks)
    outside = sorted(i for i in named if not first <= i < first + NUM_RESERVED_SPECIAL_TOKENS)
    if outside:
        raise ValueError(
            f"{config_file} names special token id {outside[0]}, outside the "
            f"{NUM_RESERVED_SPECIAL_TOKENS} ids after the vocabulary's {first} tokens"
        )
    ids = range(first, first + NUM_RESERVED_SPECIAL_TOKENS)
    special = {i: named.get(i, f"<|reserved_token_{i}|>") for i in ids}
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special.values()])
    misplaced = [name for i, name in special.items() if backend.token_to_id(name) != i]
    if misplaced:
        raise ValueError(f"{config_file}'s special token {misplaced[0]!r} is also a token of the vocabulary")
    return backend, config
