"""Speculative decoding's settings: vLLM's --speculative-config, parsed once into a typed value.

`serve --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max":
4}'` and `LLM(..., speculative_config={...})` take the same JSON object; `parse_speculative_config`
checks it field by field and names the field a bad value is in. Only the n-gram prompt-lookup
proposer exists so far: a draft model or an EAGLE head is refused, never ignored.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

METHODS = ("ngram",)
# Methods vLLM has that this runtime does not run yet: refused by name rather than as unknown.
UNSUPPORTED_METHODS = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp")
# Longer drafts are all but never accepted whole, and each drafted token costs a query position.
MAX_SPECULATIVE_TOKENS = 16
# vLLM's default window when neither prompt_lookup_min nor prompt_lookup_max is given.
DEFAULT_PROMPT_LOOKUP = 5
_FIELDS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


class SpeculativeConfigError(ValueError, argparse.ArgumentTypeError):
    """A --speculative-config the runtime cannot run; the message names the field (argparse shows
    it as it is, LLM(...) raises it as a ValueError)."""


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # K: tokens drafted per step, all verified in one target step
    prompt_lookup_max: int  # the longest n-gram looked up in the sequence's earlier tokens
    prompt_lookup_min: int  # the shortest

    def __str__(self) -> str:
        """The JSON --speculative-config takes, so that the flag round-trips (flags.to_args)."""
        return json.dumps(asdict(self))


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
    if "model" in value:
        raise SpeculativeConfigError(
            'speculative_config.model: draft models are not supported yet; use {"method": "ngram"}'
        )
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise SpeculativeConfigError(
            f"speculative_config has unknown field(s) {', '.join(unknown)}; "
            f"the fields are {', '.join(_FIELDS)}"
        )
    method = value.get("method")
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
    return SpeculativeConfig(method, k, lookup_max, lookup_min)


def _integer(value: Mapping[str, Any], name: str, default: Any) -> int:
    got = value.get(name, default)
    if got is None:
        raise SpeculativeConfigError(f"speculative_config.{name} is required")
    if isinstance(got, bool) or not isinstance(got, int):
        raise SpeculativeConfigError(f"speculative_config.{name} must be an integer, got {got!r}")
    return got
