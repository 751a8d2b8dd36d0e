"""Relevance scores of text pairs, as vLLM's score and rerank APIs give them: with an embedding model
(a bi-encoder), the cosine similarity of the two texts' embeddings; with a sequence classifier of one
output (a cross-encoder reranker), its score of the two texts run as one prompt (Tokenizer.encode_pair,
the tokenizer's own pair template)."""

from __future__ import annotations

import math
from collections.abc import Sequence


class PairsError(ValueError):
    """Texts that do not pair up (the field, then the sentence)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def pairs(
    first: str | Sequence[str], second: str | Sequence[str], names: tuple[str, str] = ("text_1", "text_2")
) -> list[tuple[str, str]]:
    """vLLM's pairing: one text against one, one against each of N, or N against N in order;
    `names`: the two fields, for the errors."""
    sides = [[side] if isinstance(side, str) else list(side) for side in (first, second)]
    for name, texts in zip(names, sides, strict=True):
        if not texts:
            raise PairsError(name, f"{name} is an empty list; give at least one text.")
        if not all(texts):
            raise PairsError(name, f"{name} holds an empty text, which has nothing to score; drop it.")
    firsts, seconds = sides
    if len(firsts) == 1:
        return [(firsts[0], text) for text in seconds]
    if len(firsts) != len(seconds):
        raise PairsError(
            names[1],
            f"{names[0]} lists {len(firsts)} texts and {names[1]} {len(seconds)}; pair one with one, one "
            "with N, or N with N.",
        )
    return list(zip(firsts, seconds, strict=True))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity; 0 where either vector is zero."""
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norms if norms else 0.0
