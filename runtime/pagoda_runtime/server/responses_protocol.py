"""OpenAI's Responses API (POST /v1/responses) in the fields this server serves, and the turn it
asks for in the chat API's terms (`as_chat`): instructions and input items become messages, tools
and text.format become the chat request's tools and response_format, so that the chat endpoint's
template, grammar and tool-call rules answer it (chat_turn.py).

The server keeps no responses: `store` is answered false, and what needs a stored response
(previous_response_id, a conversation, background runs) is a 400 naming the field, as is every
input item or tool kind other than text messages, function calls and their outputs, and functions.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pagoda_runtime.server.protocol import (
    INT32_MAX,
    ChatCompletionRequest,
    JSONSchema,
    ValidText,
    refuse_unless_default,
)
from pagoda_runtime.server.tools import FunctionDefinition

# Fields of OpenAI's request this server does not serve, each with the value that asks nothing of
# it; any other value is a 400 naming the field.
UNSERVED_FIELDS: dict[str, Any] = {
    "previous_response_id": None,
    "conversation": None,
    "background": False,
    "prompt": None,
    "max_tool_calls": None,
    "top_logprobs": None,
    "context_management": None,
}


class InputText(BaseModel):
    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(BaseModel):
    """A message of the conversation (`type` "message" or left out, as OpenAI accepts it)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(BaseModel):
    """A call the model made in an earlier turn."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    """What the client's function answered to a call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(FunctionDefinition):
    """A function the model may call: the chat API's function definition, flat."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]


class NamedFunctionChoice(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """text.format: plain text, any JSON object, or JSON under a schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: JSONSchema | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError('type "json_schema" needs a name and a schema')
        return self


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat = TextFormat(type="text")


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


_INPUT_ITEMS = ("message", "function_call", "function_call_output")


def _input_item(item: Any, index: int) -> Any:
    """OpenAI takes a message item without its "type"; the union needs one to choose a member, and
    an item of another kind (reasoning, an image, a built-in tool's call) is refused by its type."""
    if not isinstance(item, dict):
        return item
    if "type" not in item and "role" in item:
        return {**item, "type": "message"}
    if item.get("type") not in _INPUT_ITEMS:
        raise PydanticCustomError(
            "unserved_item",
            "input items of type {kind} are not served here; send messages, function calls and their outputs",
            {"param": f"input.{index}.type", "kind": repr(item.get("type"))},
        )
    return item


def _tool(tool: Any, index: int) -> Any:
    if isinstance(tool, dict) and tool.get("type") != "function":
        raise PydanticCustomError(
            "unserved_tool",
            "tools of type {kind} are not served here (no built-in tools run); give functions",
            {"param": f"tools.{index}.type", "kind": repr(tool.get("type"))},
        )
    return tool


class ResponsesRequest(ValidText):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = TextConfig()
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None
    truncation: Literal["disabled"] = "disabled"
    include: list[str] | None = None
    # vLLM's, as on the other endpoints.
    priority: int = Field(default=0, strict=True, ge=-(2**63), le=2**63 - 1)

    @model_validator(mode="before")
    @classmethod
    def _unserved_left_alone(cls, data: Any) -> Any:
        refuse_unless_default(
            data,
            UNSERVED_FIELDS,
            "{param} is not served by this server (it keeps no responses and runs no built-in tools); "
            "send the whole conversation in input",
        )
        if isinstance(data, dict):
            if isinstance(data.get("input"), list):
                data = {**data, "input": [_input_item(item, i) for i, item in enumerate(data["input"])]}
            if isinstance(data.get("tools"), list):
                data = {**data, "tools": [_tool(tool, i) for i, tool in enumerate(data["tools"])]}
        return data

    @field_validator("include")
    @classmethod
    def _nothing_included(cls, include: list[str] | None) -> list[str] | None:
        if include:
            raise ValueError("no extra output can be included by this server; leave include out")
        return include

    def as_chat(self) -> ChatCompletionRequest:
        """The same turn as a chat completions request."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                function = {"name": item.name, "arguments": item.arguments}
                call = {"id": item.call_id, "type": "function", "function": function}
                previous = messages[-1] if messages else None
                if previous is not None and previous["role"] == "assistant" and "tool_calls" in previous:
                    previous["tool_calls"].append(call)  # parallel calls of one turn: one message
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        chat: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            # Only what the request set: the model's recommended sampling fills in the rest.
            **{k: getattr(self, k) for k in ("temperature", "top_p") if k in self.model_fields_set},
            "parallel_tool_calls": self.parallel_tool_calls,
            "priority": self.priority,
            "user": self.user,
        }
        if self.tools:
            chat["tools"] = [
                {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                for tool in self.tools
            ]
        choice = self.tool_choice
        if self.tools or choice not in ("auto", "none"):  # without tools, the chat rules refuse a choice
            named = isinstance(choice, NamedFunctionChoice)
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}} if named else choice
        form = self.text.format
        if form.type == "json_object":
            chat["response_format"] = {"type": "json_object"}
        elif form.type == "json_schema":
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": form.name, "schema": form.schema_, "strict": form.strict},
            }
        if self.reasoning is not None and self.reasoning.effort is not None:
            chat["reasoning_effort"] = self.reasoning.effort
        return ChatCompletionRequest.model_validate(chat)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    """A reasoning model's thinking (with --reasoning-parser), before the message it led to."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class InputTokensDetails(BaseModel):
    cached_tokens: int  # found in the prefix cache
    cache_write_tokens: int = 0  # explicit cache writes (OpenAI's prompt_cache_options): none here


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: Literal["server_error"]
    message: str


class ResponseObject(BaseModel):
    """A response as OpenAI's API returns it, with the request's settings echoed."""

    id: str
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=time.time)
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    model: str
    output: list[OutputReasoning | OutputMessage | OutputFunctionCall] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float
    top_p: float
    tools: list[FunctionTool]
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice
    parallel_tool_calls: bool
    text: TextConfig
    metadata: dict[str, str] = Field(default_factory=dict)
    store: bool = False  # this server keeps no responses
    truncation: Literal["disabled"] = "disabled"
    previous_response_id: None = None
    user: str | None = None


class StreamEvent(BaseModel):
    """One event of a streamed response; its other fields depend on its type."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int
