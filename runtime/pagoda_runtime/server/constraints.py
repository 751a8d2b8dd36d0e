"""A request's output constraint from whichever field named it: OpenAI's response_format, vLLM's
structured_outputs, or vLLM's older guided_* fields; compiled here so that a bad one is a 400
naming the field before the request is accepted."""

from __future__ import annotations

from pagoda_runtime.engine.structured_outputs import (
    StructuredOutputError,
    StructuredOutputs,
    json_schema_text,
)
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.protocol import SamplingFields


def _named(body: SamplingFields) -> list[tuple[str, dict]]:
    """(param, StructuredOutputs arguments) for every field of the body that constrains the output."""
    found: list[tuple[str, dict]] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", {"json_object": True}))
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_
        # OpenAI's type leaves the schema optional; without one any JSON value will do.
        found.append(("response_format.json_schema.schema", {"json": {} if schema is None else schema}))
    so = body.structured_outputs
    if so is not None:
        args = {
            "json": so.json_,
            "regex": so.regex,
            "choice": so.choice,
            "grammar": so.grammar,
            "json_object": so.json_object or False,
        }
        found.append(("structured_outputs", {k: v for k, v in args.items() if v not in (None, False)}))
    for field, key in (
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        value = getattr(body, field)
        if value is not None:
            found.append((field, {key: value}))
    return found


def structured_outputs(body: SamplingFields) -> StructuredOutputs | None:
    named = _named(body)
    if not named:
        return None
    if len(named) > 1:
        params = ", ".join(param for param, _ in named)
        raise APIError(400, f"Give one output constraint, not several ({params}).", param=named[1][0])
    param, args = named[0]
    try:
        if "json" in args:
            args["json"] = json_schema_text(args["json"])
        if "choice" in args:
            args["choice"] = tuple(args["choice"])
        spec = StructuredOutputs(**args)
        spec.to_llguidance()
    except StructuredOutputError as exc:
        raise APIError(400, f"Invalid {param}: {exc}.", param=param) from exc
    return spec
