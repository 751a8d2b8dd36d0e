"""Validation rules written once. Each becomes a CEL rule in the CRD, so that the apiserver refuses
the object, and a pydantic check, so that the operator never acts on it; both say the same message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Predicate:
    """One question about an object, in CEL (with `{}` for the object) and in Python."""

    cel_template: str
    holds: Callable[[Any], bool]

    def cel(self, subject: str) -> str:
        return "(" + self.cel_template.format(subject) + ")"


@dataclass(frozen=True)
class Rule:
    cel: str  # about `self`, the object the rule is attached to
    holds: Callable[[Any], bool]
    message: str


# "Is this model source a GGUF file?", asked by the quantization rules and by sizing.
IS_GGUF_SOURCE = Predicate(
    "{0}.endsWith('.gguf') || {0}.startsWith('bundled://')",
    lambda source: source.endswith(".gguf") or source.startswith("bundled://"),
)


def cel_validations(rules: tuple[Rule, ...]) -> list[dict]:
    return [{"rule": rule.cel, "message": rule.message} for rule in rules]


def enforce(obj: Any, rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if not rule.holds(obj):
            raise ValueError(rule.message)
