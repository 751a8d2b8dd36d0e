"""What a request's output must match (a JSON schema, a regex, a choice, a grammar), as one
llguidance grammar, checked before the request is accepted.

llguidance (the engine vLLM and SGLang also use) was chosen over xgrammar because it refuses a
schema keyword it cannot enforce by name (`Unimplemented keys: ["not"]`) where xgrammar compiles
the schema and silently drops it; its per-token mask cost is in BENCHMARKS.md. This module is
torch-free, so the server validates at the edge and the engine only builds matchers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

# Compact separators with no free whitespace: a small model given free whitespace can emit
# newlines until max_tokens instead of closing the object.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredOutputError(ValueError):
    """The constraint cannot be compiled or uses a feature the grammar engine cannot enforce."""


@dataclass(frozen=True)
class StructuredOutputs:
    """Exactly one of: a JSON schema (as JSON text), any JSON object, a regex, a choice, or a
    grammar (Lark, or GBNF as llama.cpp and vLLM's xgrammar backend write it)."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (
                ("json", self.json is not None),
                ("json_object", self.json_object),
                ("regex", self.regex is not None),
                ("choice", self.choice is not None),
                ("grammar", self.grammar is not None),
            )
            if value
        ]
        if len(given) != 1:
            raise StructuredOutputError(
                f"give exactly one of json, json_object, regex, choice or grammar, not {given or 'none'}"
            )
        if self.choice is not None and not self.choice:
            raise StructuredOutputError("choice must list at least one option")

    def to_llguidance(self) -> str:
        """The llguidance grammar; raises StructuredOutputError with the engine's reason if invalid."""
        try:
            grammar = self._grammar()
        except ValueError as exc:  # llguidance refuses some inputs before compiling (non-object JSON)
            raise StructuredOutputError(_reason(str(exc))) from exc
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise StructuredOutputError(_reason(messages[0]))
        return grammar

    def _grammar(self) -> str:
        compile_ = llguidance.LLMatcher
        if self.json is not None:
            return compile_.grammar_from_json_schema(self.json, defaults=_JSON_OPTIONS)
        if self.json_object:
            return compile_.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if self.regex is not None:
            return compile_.grammar_from_regex(self.regex)
        if self.choice is not None:
            return compile_.grammar_from_regex("|".join(re.escape(c) for c in self.choice))
        try:
            lark = any_to_lark(self.grammar)
        except Exception as exc:  # the GBNF converter raises bare exceptions for syntax errors
            raise StructuredOutputError(f"the grammar is neither valid Lark nor GBNF: {exc}") from exc
        return compile_.grammar_from_lark(lark)


def json_schema_text(schema: object) -> str:
    """A JSON schema given as an object or as JSON text, as JSON text; raises if it is neither."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise StructuredOutputError(f"the JSON schema is not valid JSON: {exc}") from exc
    if schema is True:
        schema = {}  # JSON Schema's "anything"
    if not isinstance(schema, dict):
        raise StructuredOutputError("a JSON schema must be an object (false accepts no output at all)")
    return json.dumps(schema)


def _reason(message: str) -> str:
    # llguidance's messages span lines (a regex error draws a caret); an error body is one line.
    reason = " ".join(message.split())
    if "Unimplemented keys" in reason:
        keys = reason[reason.index("Unimplemented keys") :]
        return f"the JSON schema uses keywords this server cannot enforce ({keys}); remove them"
    return reason
