"""Embedding models (vLLM's pooling runner): what `--runner pooling` serves and how a sequence's
hidden states become its embedding.

A model served this way runs each prompt through the model once and returns, instead of tokens, its
final hidden states pooled into one vector: the last token's (LAST: decoder embedding models such as
Qwen3-Embedding and e5-mistral), the mean over the prompt (MEAN) or the first token's (CLS),
normalized to unit length where asked. The model folder's sentence-transformers files
(modules.json: its Pooling module's 1_Pooling/config.json and a Normalize module) say which, as
sentence-transformers reads them; `--pooler-config` (vLLM's flag) overrides them; without either,
LAST and normalized, vLLM's default for a causal language model served to embed.
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


@dataclass(frozen=True)
class PoolingParams:
    """A request to embed its prompt rather than continue it (LLM.embed, /v1/embeddings)."""


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
