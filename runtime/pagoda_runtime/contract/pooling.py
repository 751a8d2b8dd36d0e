"""Embedding and classifier models (vLLM's pooling runner): what `--runner pooling` serves and how a
sequence's hidden states become its embedding or its class probabilities.

A model served this way runs each prompt through the model once and returns, instead of tokens, its
final hidden states pooled into one vector: the last token's (LAST: decoder embedding models such as
Qwen3-Embedding and e5-mistral), the mean over the prompt (MEAN) or the first token's (CLS),
normalized to unit length where asked. The model folder's sentence-transformers files
(modules.json: its Pooling module's 1_Pooling/config.json and a Normalize module) say which, as
sentence-transformers reads them; `--pooler-config` (vLLM's flag) overrides them; without either,
LAST and normalized, vLLM's default for a causal language model served to embed.

A model trained with Matryoshka representation learning (config.json's is_matryoshka, or the sizes
it was trained at as matryoshka_dimensions; Qwen3-Embedding takes --hf-overrides '{"is_matryoshka":
true}' as on vLLM) serves shorter embeddings on request (`dimensions`): the vector's first values,
normalized after the cut where the model normalizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

# --runner: auto is generate (vLLM's choice for the *ForCausalLM architectures Pagoda serves).
RUNNERS = ("auto", "generate", "pooling")
POOLING_TYPES = ("LAST", "MEAN", "CLS")


@dataclass(frozen=True)
class PoolerConfig:
    """pooling_type: one of POOLING_TYPES; normalize: the vector scaled to unit length. None: not
    set here (the folder's or the default decides)."""

    pooling_type: str | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type {self.pooling_type!r} is not one Pagoda pools by; use "
                f"{', '.join(POOLING_TYPES)}"
            )
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, not {self.normalize!r}")

    def over(self, base: PoolerConfig | None) -> PoolerConfig:
        """This config's fields where set, `base`'s elsewhere, then the defaults (LAST, normalized)."""
        base = base or PoolerConfig()
        kind = self.pooling_type or base.pooling_type or "LAST"
        normalize = next((n for n in (self.normalize, base.normalize) if n is not None), True)
        return PoolerConfig(kind, normalize)


# What a pooled request asks for: an embedding (of an embedding model), a sequence classifier's
# probabilities, or the relevance score of a classifier with one output (a cross-encoder reranker).
POOLING_TASKS = ("embed", "classify", "score")


@dataclass(frozen=True)
class PoolingParams:
    """A request to pool its prompt rather than continue it: `task` one of POOLING_TASKS, one the
    model serves (LLM.embed and /v1/embeddings; LLM.classify and /classify; LLM.score, /score and
    /rerank score with either: a classifier's one output, or the cosine of two embeddings).
    dimensions: the embedding cut to its first values (a Matryoshka model only)."""

    task: str = "embed"
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task {self.task!r} is not one of {', '.join(POOLING_TASKS)}")


@dataclass(frozen=True)
class Classifier:
    """A sequence classifier (vLLM's *ForSequenceClassification, a cross-encoder reranker): a linear
    head over the last prompt token's final hidden state, one output per label; one label: its
    sigmoid (a relevance score), more: their softmax. The head is the checkpoint's score.weight, or,
    with from_tokens (vLLM's classifier_from_token), the LM head's rows of those tokens: one token,
    its logit; two, [false, true], the difference of their logits (the second's two-way softmax, as
    Qwen3-Reranker answers "no" or "yes")."""

    labels: tuple[str, ...]
    from_tokens: tuple[str, ...] = ()


SEQUENCE_CLASSIFICATION = "ForSequenceClassification"


def causal_architecture(architecture: str) -> str:
    """The causal LM a sequence classifier's body is (Qwen3ForSequenceClassification: Qwen3ForCausalLM)."""
    if architecture.endswith(SEQUENCE_CLASSIFICATION):
        return architecture.removesuffix(SEQUENCE_CLASSIFICATION) + "ForCausalLM"
    return architecture


def classifier_of(raw: dict[str, Any]) -> Classifier | None:
    """config.json's sequence classifier, as transformers and vLLM read it; None for a plain model."""
    tokens = raw.get("classifier_from_token")
    if tokens is not None:
        if (
            not isinstance(tokens, list)
            or len(tokens) not in (1, 2)
            or not all(isinstance(t, str) for t in tokens)
        ):
            raise ValueError(
                f"classifier_from_token must list one token or two ([false, true]), not {tokens!r}"
            )
        return Classifier(("LABEL_0",), tuple(tokens))
    if not any(str(a).endswith(SEQUENCE_CLASSIFICATION) for a in raw.get("architectures") or ()):
        return None
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            return Classifier(tuple(str(id2label[k]) for k in sorted(id2label, key=int)))
        except ValueError as exc:
            raise ValueError(f"id2label's keys must be label numbers, not {sorted(id2label)}") from exc
    labels = raw.get("num_labels", 2)  # transformers' default
    if not isinstance(labels, int) or labels < 1:
        raise ValueError(f"num_labels must be a positive integer, not {labels!r}")
    return Classifier(tuple(f"LABEL_{i}" for i in range(labels)))


@dataclass(frozen=True)
class Matryoshka:
    """A model whose embeddings' leading values are embeddings too; `dimensions`: the sizes it was
    trained at, the only ones it serves where given (any size up to the hidden size where empty)."""

    dimensions: tuple[int, ...] = ()


def matryoshka_of(raw: dict[str, Any]) -> Matryoshka | None:
    """config.json's Matryoshka keys (as vLLM reads them); None for a model without them."""
    sizes = raw.get("matryoshka_dimensions")
    if sizes is not None:
        if not isinstance(sizes, list) or not all(isinstance(d, int) and d > 0 for d in sizes):
            raise ValueError(f"matryoshka_dimensions must be a list of positive integers, not {sizes!r}")
        return Matryoshka(tuple(sizes))
    return Matryoshka() if raw.get("is_matryoshka") is True else None


def dimensions_refusal(dimensions: int, matryoshka: Matryoshka | None, hidden_size: int) -> str | None:
    """Why an embedding may not be cut to `dimensions` on this model; None where it may."""
    if matryoshka is None:
        return (
            "This model was not trained to serve shorter embeddings (no is_matryoshka or "
            "matryoshka_dimensions in its config.json); drop dimensions."
        )
    if matryoshka.dimensions and dimensions not in matryoshka.dimensions:
        sizes = ", ".join(map(str, matryoshka.dimensions))
        return f"dimensions {dimensions} is not a size this model was trained at; use one of {sizes}."
    if not 1 <= dimensions <= hidden_size:
        return f"dimensions must be between 1 and the model's {hidden_size}, not {dimensions}."
    return None


def parse_pooler_config(text: str | dict[str, Any] | PoolerConfig) -> PoolerConfig:
    """--pooler-config's JSON object, e.g. '{"pooling_type": "MEAN", "normalize": false}'."""
    if isinstance(text, PoolerConfig):
        return text
    try:
        raw = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise ValueError(f"--pooler-config is not valid JSON ({exc}); give a JSON object") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"--pooler-config must be a JSON object, not {raw!r}")
    known = {f.name for f in fields(PoolerConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(
            f"--pooler-config has {', '.join(unknown)}, which Pagoda does not read; it reads "
            f"{', '.join(sorted(known))}"
        )
    kind = raw.get("pooling_type")
    return PoolerConfig(kind.upper() if isinstance(kind, str) else kind, raw.get("normalize"))
