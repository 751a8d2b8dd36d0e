"""vLLM's bad_words: words a request never generates, held as the token sequences that spell them.

Each word is tokenized as it begins the text ("word") and as it follows a space (" word"), because
most tokenizers spell the two differently; the second is kept unless it is the first or the first
after a lone space token (a SentencePiece tokenizer that adds the space itself). vLLM keeps the
second only when it is as long as the first, so that with a BPE tokenizer a word it splits
differently mid-text ("primary" two tokens, " primary" one) is not banned there; here it is. A
sequence's last token is banned whenever the output ends with the rest of it, so a one-token word
is never sampled. Only the output counts, not the prompt, as in vLLM; a word the model spells with
other tokens is not caught, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# vLLM's bounds: sequences a request (and so words), and tokens over all of them.
MAX_BAD_WORDS = 128
MAX_BAD_WORD_TOKENS = 1024


@dataclass(frozen=True)
class BadWords:
    sequences: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, words: Sequence[str], encode: Callable[[str], list[int]]) -> BadWords:
        """`encode`: text -> ids without special tokens. Raises ValueError for a word that spells
        nothing or words over the bounds."""
        sequences: list[tuple[int, ...]] = []
        for word in words:
            alone = tuple(encode(word.lstrip()))
            if not alone:
                raise ValueError(f"bad_words entry {word!r} has no tokens; remove it")
            sequences.append(alone)
            spaced = tuple(encode(" " + word.lstrip()))
            if spaced and spaced != alone and spaced[1:] != alone:
                sequences.append(spaced)
        if len(sequences) > MAX_BAD_WORDS:
            raise ValueError(
                f"bad_words spell {len(sequences)} token sequences (a word mid-text is another), more than "
                f"the {MAX_BAD_WORDS} allowed; send fewer words"
            )
        total = sum(map(len, sequences))
        if total > MAX_BAD_WORD_TOKENS:
            raise ValueError(
                f"bad_words spell {total} tokens, more than the {MAX_BAD_WORD_TOKENS} allowed; "
                "send fewer or shorter words"
            )
        return cls(tuple(sequences))

    @property
    def needs_history(self) -> bool:
        """Whether a ban depends on the tokens before it (a word of several tokens)."""
        return any(len(s) > 1 for s in self.sequences)

    def banned(self, output: Sequence[int]) -> set[int]:
        """The tokens that may not follow `output` (the request's output tokens so far)."""
        banned = set()
        for s in self.sequences:
            head = len(s) - 1
            if head == 0 or (len(output) >= head and tuple(output[len(output) - head :]) == s[:head]):
                banned.add(s[-1])
        return banned

    def token_ids(self) -> list[int]:
        return [t for s in self.sequences for t in s]
