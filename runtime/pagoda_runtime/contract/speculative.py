"""Speculative decoding's settings: vLLM's --speculative-config, parsed once into a typed value.

`serve --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max":
4}'` and `LLM(..., speculative_config={...})` take the same JSON object; `parse_speculative_config`
checks it field by field and names the field a bad value is in. Two proposers run: n-gram prompt
lookup (`"method": "ngram"`), a draft model (`"model": "<name or path>"`, `"method": "draft_model"`
optional, as vLLM infers it) and an EAGLE head (`"method": "eagle3"` or `"eagle"` with `"model":
"<head folder>"`, engine/eagle_proposer.py) and the target checkpoint's own multi-token-prediction
layer (`"method": "mtp"`, vLLM's name; its older `deepseek_mtp` and `glm4_moe_mtp` are read as it,
executor/models/mtp_head.py); Medusa and MLP speculators are refused, never ignored.
`disable_by_batch_size` (vLLM's speculative_disable_by_batch_size) switches speculation off for a
step while more sequences than that are running: batching already amortizes the weight reads that
speculation saves (the default is measured, BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# EAGLE heads, whose "model" is a head folder (engine/eagle_proposer.py).
HEAD_METHODS = ("eagle", "eagle3")
# The target checkpoint's multi-token-prediction layer (DeepSeek V3, GLM-4.5): no "model" of its own.
MTP = "mtp"
METHODS = ("ngram", "draft_model", *HEAD_METHODS, MTP)
# The methods whose "model" is a second network the proposer runs.
MODEL_METHODS = ("draft_model", *HEAD_METHODS)
# vLLM's earlier per-family names of the mtp method, which it reads as "mtp" too.
MTP_ALIASES = ("deepseek_mtp", "glm4_moe_mtp")
# Methods vLLM has that this runtime does not run yet: refused by name rather than as unknown.
UNSUPPORTED_METHODS = ("medusa", "mlp_speculator")
# Longer drafts are all but never accepted whole, and each drafted token costs a query position.
MAX_SPECULATIVE_TOKENS = 16
# vLLM's default window when neither prompt_lookup_min nor prompt_lookup_max is given.
DEFAULT_PROMPT_LOOKUP = 5
# Above this many running sequences a step does not speculate (benchmarks/spec_decode.py on the CPU).
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
_LOOKUP_FIELDS = ("prompt_lookup_max", "prompt_lookup_min")
_FIELDS = ("method", "model", "num_speculative_tokens", *_LOOKUP_FIELDS, "disable_by_batch_size")


class SpeculativeConfigError(ValueError, argparse.ArgumentTypeError):
    """A --speculative-config the runtime cannot run; the message names the field (argparse shows
    it as it is, LLM(...) raises it as a ValueError)."""


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # K: the most tokens drafted per step, all verified in one target step
    prompt_lookup_max: int | None = None  # ngram: the longest n-gram looked up in earlier tokens
    prompt_lookup_min: int | None = None  # ngram: the shortest
    # draft_model: its name or path, with the target's vocabulary; eagle / eagle3: the head's folder
    model: str | None = None
    # Speculation is off for a step while more sequences than this are running.
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __str__(self) -> str:
        """The JSON --speculative-config takes, so that the flag round-trips (flags.to_args)."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})


def parse_speculative_config(value: str | Mapping[str, Any]) -> SpeculativeConfig:
    """A --speculative-config JSON string or an LLM(speculative_config=...) mapping, checked."""
    if isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpeculativeConfigError(f"--speculative-config is not valid JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise SpeculativeConfigError(
            'speculative_config must be a JSON object such as {"method": "ngram", ...}'
        )
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise SpeculativeConfigError(
            f"speculative_config has unknown field(s) {', '.join(unknown)}; "
            f"the fields are {', '.join(_FIELDS)}"
        )
    # As vLLM: a draft model's method may be left out.
    method = value.get("method", "draft_model" if "model" in value else None)
    if method in MTP_ALIASES:
        method = MTP
    if method in UNSUPPORTED_METHODS:
        raise SpeculativeConfigError(
            f"speculative_config.method {method!r} is not supported yet; use one of {', '.join(METHODS)}"
        )
    if method not in METHODS:
        raise SpeculativeConfigError(
            f"speculative_config.method must be one of {', '.join(METHODS)}, got {method!r}"
        )
    k = _integer(value, "num_speculative_tokens", None)
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise SpeculativeConfigError(
            f"speculative_config.num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}"
        )
    cutoff = _integer(value, "disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE)
    if cutoff < 1:
        raise SpeculativeConfigError(
            f"speculative_config.disable_by_batch_size must be at least 1, got {cutoff}"
        )
    if method in MODEL_METHODS:
        return _model_config(value, method, k, cutoff)
    if method == MTP:
        if "model" in value:
            raise SpeculativeConfigError(
                "speculative_config.model is not taken by the mtp method, which drafts with the served "
                "checkpoint's own multi-token-prediction layer; leave it out"
            )
        _no_lookup(value, method)
        return SpeculativeConfig(MTP, k, disable_by_batch_size=cutoff)
    if "model" in value:
        raise SpeculativeConfigError(
            'speculative_config.model names a draft model or an EAGLE head, which needs "method": '
            f'"draft_model", "eagle" or "eagle3" (or no method), not {method!r}'
        )
    # As vLLM: either bound alone sets both; neither gives the default window.
    lookup_max = _integer(value, "prompt_lookup_max", value.get("prompt_lookup_min", DEFAULT_PROMPT_LOOKUP))
    lookup_min = _integer(value, "prompt_lookup_min", lookup_max)
    if lookup_min < 1:
        raise SpeculativeConfigError(
            f"speculative_config.prompt_lookup_min must be at least 1, got {lookup_min}"
        )
    if lookup_max < lookup_min:
        raise SpeculativeConfigError(
            f"speculative_config.prompt_lookup_max ({lookup_max}) must be at least prompt_lookup_min "
            f"({lookup_min})"
        )
    return SpeculativeConfig(method, k, lookup_max, lookup_min, disable_by_batch_size=cutoff)


def _model_config(value: Mapping[str, Any], method: str, k: int, cutoff: int) -> SpeculativeConfig:
    model = value.get("model")
    what = "the draft model (a name or a path)" if method == "draft_model" else "the EAGLE head's folder"
    if not isinstance(model, str) or not model:
        raise SpeculativeConfigError(
            f"speculative_config.model must name {what} for the {method} method, got {model!r}"
        )
    _no_lookup(value, method)
    return SpeculativeConfig(method, k, model=model, disable_by_batch_size=cutoff)


def _no_lookup(value: Mapping[str, Any], method: str) -> None:
    lookup = [name for name in _LOOKUP_FIELDS if name in value]
    if lookup:
        raise SpeculativeConfigError(
            f"speculative_config.{lookup[0]} applies to the ngram method only; leave it out with {method}"
        )


def _integer(value: Mapping[str, Any], name: str, default: Any) -> int:
    got = value.get(name, default)
    if got is None:
        raise SpeculativeConfigError(f"speculative_config.{name} is required")
    if isinstance(got, bool) or not isinstance(got, int):
        raise SpeculativeConfigError(f"speculative_config.{name} must be an integer, got {got!r}")
    return got
