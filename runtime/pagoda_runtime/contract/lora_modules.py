"""`--lora-modules` entries, as vLLM spells them: `name=path`, or the JSON form
`{"name": ..., "path": ..., "base_model_name": ...}`. Torch-free: the flags and the operator read it."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(word: str) -> LoraModule:
    """One --lora-modules word -> LoraModule; ValueError saying what a good entry looks like."""
    usage = 'give name=path or {"name": ..., "path": ...}'
    if word.lstrip().startswith("{"):
        try:
            raw = json.loads(word)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules entry {word!r} is not valid JSON ({exc}); {usage}") from exc
        unknown = set(raw) - {"name", "path", "base_model_name"} if isinstance(raw, dict) else set()
        if (
            not isinstance(raw, dict)
            or unknown
            or not isinstance(raw.get("name"), str)
            or not isinstance(raw.get("path"), str)
        ):
            raise ValueError(f"--lora-modules entry {word!r} needs string fields name and path only; {usage}")
        module = LoraModule(raw["name"], raw["path"], raw.get("base_model_name"))
    else:
        name, sep, path = word.partition("=")
        module = LoraModule(name.strip(), path.strip())
        if not sep:
            raise ValueError(f"--lora-modules entry {word!r} has no '='; {usage}")
    if not module.name or not module.path:
        raise ValueError(f"--lora-modules entry {word!r} has an empty name or path; {usage}")
    return module


def checked_lora_module(word: str) -> str:
    """The flag's parser: the word as given (so that the setting round-trips as arguments), once it
    parses."""
    parse_lora_module(word)
    return word
