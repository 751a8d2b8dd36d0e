"""Finding tool calls in generated text, whole or while it streams.

Each parser answers two questions about the text so far: how much of it is plain content for
certain (so it may stream now), and which calls are complete. Streaming sends content as soon as
it is certain and each call once it is complete (name and all its arguments in one delta, which
the OpenAI client assembles like any other); text that looked like a call but was not one is
sent as content at the end, as the whole response would have it.
"""

from __future__ import annotations

import json
import re

from pagoda_runtime.server.markup_tool_parsers import (
    UNPARSED,
    BlockParser,
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    Glm45Parser,
    KimiK2Parser,
    MiniMaxM2Parser,
    MistralParser,
    PythonicParser,
    Qwen3CoderParser,
    Schemas,
    partial_suffix,
)
from pagoda_runtime.server.reasoning import HARMONY_ARGUMENTS, HARMONY_CALL
from pagoda_runtime.server.tools import DeltaFunctionCall, DeltaToolCall, FunctionCall, call_id, new_call_id


def _call(obj: object) -> FunctionCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    return FunctionCall(
        name=obj["name"], arguments=arguments if isinstance(arguments, str) else json.dumps(arguments)
    )


class HermesParser(BlockParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen2.5, Hermes and SmolLM write."""

    START, MARKERS = "<tool_call>", ("<tool_call>", "</tool_call>")
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        found = []
        for block in self._BLOCK.findall(text):
            try:
                found.append(_call(json.loads(block)))
            except UNPARSED:
                found.append(None)
        return found


class Llama3JsonParser:
    """Llama 3.x's JSON tool calls: `{"name": ..., "parameters": {...}}`, several joined by `;`,
    optionally after `<|python_tag|>`; any other text is content."""

    TAG = "<|python_tag|>"
    # The calls read alike with or without the tag, which Llama 3 holds as a special token.
    MARKERS: tuple[str, ...] = ()

    def _body(self, text: str) -> str:
        return text.strip().removeprefix(self.TAG).lstrip()

    def content_end(self, text: str, final: bool) -> int:
        head = text.lstrip()
        if (
            (not head and not final)
            or head.startswith(("{", self.TAG))
            or (head and self.TAG.startswith(head))
        ):
            return 0
        return len(text)

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        body = self._body(text)
        if not final or not body.startswith("{"):
            return []
        decoder, found, i = json.JSONDecoder(), [], 0
        while i < len(body):
            try:
                obj, i = decoder.raw_decode(body, i)
            except UNPARSED:
                return []
            call = _call(obj)
            if call is None:
                return []
            found.append(call)
            while i < len(body) and body[i] in " \t\r\n;":
                i += 1
        return found


class HarmonyParser:
    """GPT-OSS's tool calls: harmony messages to functions.NAME, which the openai_gptoss reasoning
    split leaves in the content as HARMONY_CALL segments (reasoning.split_harmony). A call ends the
    model's turn (<|call|> is one of its stop tokens), so the calls are read from the finished text."""

    # The openai_gptoss reasoning parser keeps harmony's special tokens in the text already.
    MARKERS: tuple[str, ...] = ()

    def content_end(self, text: str, final: bool) -> int:
        start = text.find(HARMONY_CALL)
        if start >= 0:
            return start
        return len(text) if final else len(text) - partial_suffix(text, HARMONY_CALL)

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        if not final:
            return []
        found = []
        for segment in text.split(HARMONY_CALL)[1:]:
            name, _, arguments = segment.partition(HARMONY_ARGUMENTS)
            found.append(FunctionCall(name=name, arguments=arguments.strip()))
        return found


class RequiredArrayParser:
    """tool_choice "required": the grammar makes the whole text a JSON array of {name, parameters}."""

    MARKERS: tuple[str, ...] = ()

    def content_end(self, text: str, final: bool) -> int:
        return 0

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        decoder, found = json.JSONDecoder(), []
        i = text.find("[") + 1
        while i > 0:
            while i < len(text) and text[i] in " \t\r\n,":
                i += 1
            try:
                obj, i = decoder.raw_decode(text, i)
            except UNPARSED:
                break
            if (call := _call(obj)) is not None:
                found.append(call)
        return found


# --tool-call-parser's choices (contract/serve_settings.TOOL_CALL_PARSERS), each built with the
# request's tool schemas, which the formats that write arguments as bare text read their types from.
PARSERS = {
    "hermes": HermesParser,
    "llama3_json": lambda schemas: Llama3JsonParser(),
    "openai": lambda schemas: HarmonyParser(),
    "deepseek_v3": DeepSeekV3Parser,
    "deepseek_v31": DeepSeekV31Parser,
    "glm45": Glm45Parser,
    "qwen3_coder": Qwen3CoderParser,
    "minimax_m2": MiniMaxM2Parser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
    # vLLM's name for the same format in Llama 4's <|python_start|> ... <|python_end|> markers.
    "llama4_pythonic": PythonicParser,
    "kimi_k2": KimiK2Parser,
}


def parser_named(name: str, schemas: Schemas | None = None):
    return PARSERS[name](schemas)


def parse_whole(parser, text: str) -> tuple[str | None, list[FunctionCall]]:
    """(content, calls) of a finished text; with no call found the whole text is content."""
    calls = parser.calls(text, True)
    if not calls:
        return text, []
    return text[: parser.content_end(text, True)].strip() or None, calls


class ToolCallStream:
    """One choice's streamed text turned into content deltas and tool-call deltas."""

    def __init__(self, parser) -> None:
        self.parser = parser
        self.sent_content = 0
        self.sent_calls = 0

    @property
    def called(self) -> bool:
        return self.sent_calls > 0

    def feed(self, text: str, final: bool) -> tuple[str, list[DeltaToolCall]]:
        end = self.parser.content_end(text, final)
        content = text[self.sent_content : end] if end > self.sent_content else ""
        self.sent_content = max(self.sent_content, end)
        calls = self.parser.calls(text, final)
        deltas = [
            DeltaToolCall(
                index=i,
                id=call_id(call),
                type="function",
                function=DeltaFunctionCall(name=call.name, arguments=call.arguments),
            )
            for i, call in enumerate(calls[self.sent_calls :], start=self.sent_calls)
        ]
        self.sent_calls = max(self.sent_calls, len(calls))
        if final and not self.called:
            content += text[self.sent_content :]
            self.sent_content = len(text)
        if self.called and not content.strip():
            content = ""
        return content, deltas


class NamedCallStream:
    """tool_choice naming a function: the whole text is its arguments, streamed as they come."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent = 0
        self.called = False

    def feed(self, text: str, final: bool) -> tuple[str, list[DeltaToolCall]]:
        deltas = []
        if not self.called:
            self.called = True
            deltas.append(
                DeltaToolCall(
                    index=0,
                    id=new_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=self.name, arguments=""),
                )
            )
        if len(text) > self.sent:
            deltas.append(DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text[self.sent :])))
            self.sent = len(text)
        return "", deltas
