"""Request and response bodies in OpenAI's shapes, field for field where we support a field.

Fields we know but do not implement are rejected by name instead of being silently ignored, so a
client never gets a result computed without the behaviour it asked for. Unknown fields are ignored,
as OpenAI-compatible servers commonly do, so that SDKs sending newer fields keep working.

Every number a request carries is bounded here, next to its field (OpenAI's or vLLM's range where
they give one, else what the engine's integer types hold), so that no value reaches the engine that
it cannot represent; a new field declares its bound the same way. Whether token ids lie inside the
model's vocabulary is the engine's check (request_validation.py), since only it knows the model.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.engine.bad_words import MAX_BAD_WORDS
from pagoda_runtime.server.tools import DeltaToolCall, ToolCall, ToolChoice, ToolDefinition

# The widest integer a token count, a token id or top_k may be: they end up in int32 tensors.
INT32_MAX = 2**31 - 1
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
TokenCount = Annotated[int, Field(ge=1, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# OpenAI's range for a logit bias, and how many tokens one request may bias (each is host work in
# every step the request samples in).
LogitBias = Annotated[float, Field(ge=-100.0, le=100.0)]
MAX_LOGIT_BIAS = 300
# How many tokens allowed_token_ids may name (host work in every step, as logit_bias).
MAX_ALLOWED_TOKENS = 4096
# A bad word longer than this spells more tokens than bad_words may hold in all.
MAX_BAD_WORD_CHARS = 4096
StopStrings = str | list[Annotated[str, Field(min_length=1)]] | None
# OpenAI's documented limit; a longer list is refused by name instead of by a union's type error.
MAX_STOP_STRINGS = 4
# The most completions one request asks for (n, times its prompts on completions): each is a
# sequence of the batch, and n alone goes this far.
MAX_COMPLETIONS = 128
JSONSchema = dict[str, Any] | bool


class JSONSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema; strict or not, the schema is enforced by the grammar."""

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: JSONSchema | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a json_schema object with a name and a schema')
        return self


class StructuredOutputsField(BaseModel):
    """vLLM's structured_outputs: exactly one constraint; other vLLM options are refused by name."""

    model_config = ConfigDict(extra="forbid")

    json_: JSONSchema | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate_at(value: Any) -> str | None:
    """Where a string, or an object's key, holds a lone UTF-16 surrogate (JSON allows "\\ud800"; no
    tokenizer or grammar engine can take it), or None. The path shows such a key escaped, since the
    error that names it must itself be valid text."""
    pending: list[tuple[Any, str]] = [(value, "")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, str) and not _valid(value):
            return path
        children: list[tuple[Any, str]] = []
        if isinstance(value, dict):
            for key, item in value.items():
                name = str(key) if _valid(str(key)) else str(key).encode("utf-8", "backslashreplace").decode()
                where = f"{path}.{name}" if path else name
                if name != str(key):
                    return where
                children.append((item, where))
        elif isinstance(value, list):
            children = [(item, f"{path}.{i}") for i, item in enumerate(value)]
        pending.extend(reversed(children))  # the first in document order is reported
    return None


def token_ids_in_range(prompt: Any) -> Any:
    """A prompt field (text, token ids, or a list of either) whose ids fit 0 .. INT32_MAX; said
    before validation, where the union's own error would only say the ids are not a string."""
    batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]
    for ids in batch:
        if not isinstance(ids, list):
            continue
        bad = next((t for t in ids if isinstance(t, int) and not 0 <= t <= INT32_MAX), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside 0 to {INT32_MAX}; check the tokenizer")
    return prompt


class ValidText(BaseModel):
    """A request body whose every string is valid Unicode."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        if (path := _lone_surrogate_at(data)) is not None:
            raise PydanticCustomError(
                "lone_surrogate",
                "{param} contains a lone UTF-16 surrogate, which is not valid Unicode; send valid text",
                {"param": path},
            )
        return data


# vLLM's request fields this server does not implement, each with the value that asks nothing of it:
# any other value is a 400 naming the field (unknown fields are ignored, so these must be named).
UNIMPLEMENTED_VLLM_FIELDS: dict[str, Any] = {
    "use_beam_search": False,
    "spaces_between_special_tokens": True,
    "logprob_token_ids": None,
    "prompt_embeds": None,
    "thinking_token_budget": None,
    "repetition_detection": None,
    "length_penalty": 1.0,
    "watermarking": False,
    "stream_interval": None,
    "return_prompt_text": False,
    "vllm_xargs": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "media_io_kwargs": None,
    "mm_processor_kwargs": None,
}


def refuse_unless_default(data: Any, fields: dict[str, Any], message: str) -> None:
    """Raises a 400 naming the first of `fields` (a known field this server does not serve) that a
    raw body sets to anything but null or the value that asks nothing; `message` holds {param}."""
    if isinstance(data, dict):
        for name, default in fields.items():
            if data.get(name) not in (None, default):
                raise PydanticCustomError("unserved", message, {"param": name})


class Truncation(BaseModel):
    """vLLM's: only the prompt's last N tokens are kept (-1: as many as the context holds), or with
    truncation_side "right" its first N (generation.truncated)."""

    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    truncation_side: Literal["left", "right"] = "left"

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _some_prompt_kept(cls, keep: int | None) -> int | None:
        if keep == 0:
            raise ValueError("0 would keep no prompt token; give at least 1, or -1 for the context length")
        return keep


class SamplingFields(ValidText, Truncation):
    """The sampling knobs both endpoints share."""

    model_config = ConfigDict(extra="ignore")
    # The fields of UNIMPLEMENTED_VLLM_FIELDS this endpoint refuses, with theirs.
    unimplemented: ClassVar[dict[str, Any]] = UNIMPLEMENTED_VLLM_FIELDS

    model: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_COMPLETIONS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: Int64 | None = None
    stop: StopStrings = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, LogitBias] | None = None
    # vLLM's extensions, which load generators and evaluation harnesses rely on.
    top_k: int = Field(default=0, ge=-1, le=INT32_MAX)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    # Lower is served first under --scheduling-policy priority (engine/priority.py); strict, so that
    # 1.5 or "1" is a 400 rather than a silently rounded or parsed priority.
    priority: Int64 = Field(default=0, strict=True)
    # vLLM's: salts the prefix cache's keys, so that only requests with the same salt share KV blocks
    # (another tenant cannot tell from a faster first token that a prompt was seen before).
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    # vLLM's: each prompt token's logprob, rank and this many likeliest alternatives, in the
    # response's prompt_logprobs; strict, so that "1" or 1.5 is a 400 rather than a parsed count.
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    stop_token_ids: list[TokenId] | None = None
    # vLLM's: only these tokens may be sampled (each inside the vocabulary: the engine's check).
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1, max_length=MAX_ALLOWED_TOKENS)
    # vLLM's: words never generated (engine/bad_words.py), at most its 128.
    bad_words: list[Annotated[str, Field(min_length=1, max_length=MAX_BAD_WORD_CHARS)]] | None = Field(
        default=None, max_length=MAX_BAD_WORDS
    )
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's: the prompt's and each choice's token ids beside the text (what RL trainers read).
    return_token_ids: bool = False
    # vLLM's: logprobs name each token token_id:<id>; unset, --return-tokens-as-token-ids decides.
    return_tokens_as_token_ids: bool | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    # vLLM's older names for structured_outputs' members.
    guided_json: JSONSchema | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, stop: object) -> object:
        if stop == "":
            raise ValueError("stop strings must not be empty")
        if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed, got {len(stop)}")
        return stop

    @model_validator(mode="before")
    @classmethod
    def _unimplemented_left_alone(cls, data: Any) -> Any:
        refuse_unless_default(data, cls.unimplemented, "{param} is not supported by this server; remove it")
        return data

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_whole(cls, count: int | None, info: ValidationInfo) -> int | None:
        if count is not None and info.data.get("stream"):
            raise ValueError(
                "prompt_logprobs are not available when streaming, as in vLLM; set stream to false"
            )
        return count

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_as_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is None:
            return None
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased, got {len(bias)}")
        if not all(key.isascii() and key.isdigit() for key in bias):
            raise ValueError('keys must be token ids written as strings, e.g. {"1234": -100}')
        return bias

    def tokens_as_ids(self, settings: ServerSettings) -> bool:
        """Whether logprobs show tokens as token_id:<id>: the request's choice, else the server's."""
        if self.return_tokens_as_token_ids is None:
            return settings.return_tokens_as_token_ids
        return self.return_tokens_as_token_ids

    def logit_bias_by_id(self) -> dict[int, float] | None:
        return None if self.logit_bias is None else {int(k): v for k, v in self.logit_bias.items()}

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    add_special_tokens: bool = True  # vLLM's: False leaves out the BOS the tokenizer would add
    # 0 only with echo: the prompt and its logprobs alone, as OpenAI's legacy API and vLLM give.
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=5)
    # The prompt before each completion's text, with logprobs its tokens' too (the first's null):
    # how evaluation harnesses score a text's likelihood.
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        if best_of is not None and best_of != info.data.get("n", 1):
            raise ValueError("best_of other than n is not supported by this server; remove it")
        return best_of

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("suffix (insertion) is not supported by this server; remove it")
        return suffix

    @field_validator("prompt", mode="before")
    @classmethod
    def _token_ids_in_range(cls, prompt: Any) -> Any:
        return token_ids_in_range(prompt)

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: one text or token-id list, or a list of either (a batch)."""
        batch = isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list)
        return list(self.prompt) if batch else [self.prompt]

    @model_validator(mode="after")
    def _bounded_batch(self) -> CompletionRequest:
        prompts = len(self.prompts())
        if (total := prompts * self.n) > MAX_COMPLETIONS:
            raise PydanticCustomError(
                "too_many_completions",
                "{prompts} prompts with n {n} ask for {total} completions, more than the {most} one "
                "request may; split the prompts over several requests",
                {"param": "prompt", "prompts": prompts, "n": self.n, "total": total, "most": MAX_COMPLETIONS},
            )
        return self

    @model_validator(mode="after")
    def _no_tokens_only_with_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise PydanticCustomError(
                "no_tokens",
                "0 generates nothing; ask for at least 1 token, or set echo to score the prompt alone",
                {"param": "max_tokens"},
            )
        return self

    def scores_prompt_only(self) -> bool:
        """echo with max_tokens 0: the prompt (and its logprobs) is the whole answer."""
        return self.echo and self.max_tokens == 0


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # which call a tool message answers

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        # Images and audio are not served (a multimodal checkpoint is served for its text): say so
        # rather than that the part is not a string.
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") not in (None, "text"):
                raise ValueError(
                    f"content parts of type {part['type']!r} are not served, only text; send the message "
                    "as text parts"
                )
        return content

    @model_validator(mode="after")
    def _tool_fields_on_their_roles(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def for_template(self) -> dict[str, Any]:
        # "developer" is OpenAI's newer name for the system role; chat templates only know "system".
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        if self.tool_calls:
            # Templates index into the arguments (Qwen's, Llama's): give them the object, not its JSON text.
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": _json_or_text(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatTemplateOptions(BaseModel):
    """vLLM's chat-template options, on the chat endpoint and on /tokenize's messages
    (engine/chat_prompt.py)."""

    add_generation_prompt: bool = True
    # The final message left open for the model to go on with: a reply the client prefilled.
    continue_final_message: bool = False
    # The template's own variables, such as Qwen 3's enable_thinking.
    chat_template_kwargs: dict[str, Any] | None = None
    # Retrieved documents, for templates that write them (RAG), e.g. [{"title": ..., "text": ...}].
    documents: list[dict[str, str]] | None = None
    # OpenAI's; to the template as its variable, and (as vLLM does) "none" turns a template's
    # thinking off unless chat_template_kwargs says otherwise.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template: str | None = None

    @field_validator("chat_template")
    @classmethod
    def _no_request_template(cls, template: str | None) -> str | None:
        # A template is code the server runs; vLLM too refuses one from a request unless trusted.
        if template is not None:
            raise ValueError("a chat template per request is not accepted; serve with --chat-template")
        return template


class ChatCompletionRequest(SamplingFields, ChatTemplateOptions):
    # vLLM's chat adds no special tokens of its own by default (the template writes them).
    unimplemented: ClassVar[dict[str, Any]] = UNIMPLEMENTED_VLLM_FIELDS | {"add_special_tokens": False}

    # vLLM's: the reply begins with the last message's text when that message has the reply's role
    # (with continue_final_message, the prefilled part and its continuation make one message).
    echo: bool = False
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: list[Any] | None = None
    # vLLM's: false leaves the reasoning a --reasoning-parser finds out of the reply.
    include_reasoning: bool = True

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, functions: list[Any] | None) -> list[Any] | None:
        if functions:
            raise ValueError("the deprecated functions field is not supported; send tools instead")
        return functions

    def completion_token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # null: an echoed first token
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's Logprob, as its prompt_logprobs report each token: keyed by the token's id."""

    logprob: float
    rank: int  # 1: the likeliest token
    decoded_token: str


# Per prompt token, None for the first (nothing predicts it): the token's entry and its top k.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


def _absent_when_none(**kwargs: Any) -> Any:
    """A field of vLLM's that a response carries only when the request asked for it."""
    return Field(default=None, exclude_if=lambda v: v is None, **kwargs)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = _absent_when_none()
    prompt_token_ids: list[int] | None = _absent_when_none()  # streamed: in a choice's first chunk
    token_ids: list[int] | None = _absent_when_none()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] = Field(default_factory=list)
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, exclude_if=lambda v: v is None)
    # With --reasoning-parser: the model's thinking, under vLLM's older name and its newer one.
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None)
    reasoning: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _absent_when_none()


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = _absent_when_none()
    prompt_token_ids: list[int] | None = _absent_when_none()


class DeltaMessage(BaseModel):
    # OpenAI omits what a chunk does not carry: the role comes once, the last delta is {}.
    role: Literal["assistant"] | None = Field(default=None, exclude_if=lambda v: v is None)
    content: str | None = Field(default=None, exclude_if=lambda v: v is None)
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=lambda v: v is None)
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None)
    reasoning: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _absent_when_none()


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = _absent_when_none()  # in the first chunk


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pagoda"
    max_model_len: int
    root: str | None = None  # the model's path; of a LoRA adapter, the path it was loaded from
    parent: str | None = None  # of a LoRA adapter: the base model's name


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
