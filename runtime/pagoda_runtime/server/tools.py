"""Tool calling as vLLM does it: tools go to the chat template; tool_choice "auto" lets the model
choose and a parser finds its calls in the text; "required" and a named function are enforced by
the grammar (a JSON array of {name, parameters}, or the named function's arguments), so the
answer is always a well-formed call; "none" leaves the text alone."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pagoda_runtime.engine.structured_outputs import StructuredOutputError, StructuredOutputs
from pagoda_runtime.server.errors import APIError


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ParsedCall(FunctionCall):
    """A call a tool parser read, with the id the model's markup gives it where it gives one (Kimi
    K2's functions.NAME:INDEX, which its chat template names the tool's result by); never sent as
    part of the function."""

    id: str | None = Field(default=None, exclude=True)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(default_factory=lambda: new_call_id())
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=lambda v: v is None)
    arguments: str | None = Field(default=None, exclude_if=lambda v: v is None)


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    type: Literal["function"] | None = Field(default=None, exclude_if=lambda v: v is None)
    function: DeltaFunctionCall


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_id(call: FunctionCall) -> str:
    """The id a parsed call is sent with: the model's own where it wrote one, else a new one."""
    return getattr(call, "id", None) or new_call_id()


def template_tools(tools: list[ToolDefinition] | None) -> list[dict] | None:
    """The tools as chat templates expect them (OpenAI's JSON shape)."""
    return None if not tools else [tool.model_dump(exclude_none=True) for tool in tools]


def _parameters(function: FunctionDefinition) -> dict:
    return function.parameters if function.parameters is not None else {"type": "object"}


def tool_choice_constraint(
    tools: list[ToolDefinition] | None, tool_choice: ToolChoice | None, parallel_tool_calls: bool
) -> StructuredOutputs | None:
    """The grammar that enforces "required" or a named function; None where the model chooses."""
    if tool_choice is not None and tool_choice != "none" and not tools:
        raise APIError(
            400, "tool_choice needs tools; send the functions the model may call.", param="tool_choice"
        )
    if tool_choice in (None, "none", "auto"):
        return None
    if isinstance(tool_choice, NamedToolChoice):
        by_name = {tool.function.name: tool for tool in tools}
        chosen = by_name.get(tool_choice.function.name)
        if chosen is None:
            raise APIError(
                400,
                f"tool_choice names the function '{tool_choice.function.name}', which is not in tools "
                f"({', '.join(by_name)}).",
                param="tool_choice",
            )
        schema, param = _parameters(chosen.function), f"tools.{tools.index(chosen)}.function.parameters"
    else:
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool.function.name},
                    "parameters": _parameters(tool.function),
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for tool in tools
        ]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not parallel_tool_calls:
            schema["maxItems"] = 1
        param = "tools"
    spec = StructuredOutputs(json=json.dumps(schema))
    try:
        spec.to_llguidance()
    except StructuredOutputError as exc:
        raise APIError(400, f"Invalid {param}: {exc}.", param=param) from exc
    return spec
