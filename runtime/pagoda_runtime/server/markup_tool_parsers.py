"""Tool-call markup other than hermes JSON, under vLLM's --tool-call-parser names:

- `deepseek_v3` (DeepSeek V3, R1): <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
  then the arguments in a ```json fence, <｜tool▁call▁end｜>, ... <｜tool▁calls▁end｜>;
- `deepseek_v31` (DeepSeek V3.1 and later):
  <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜> inside the same outer markers;
- `glm45` (GLM-4.5, 4.6): <tool_call>NAME <arg_key>K</arg_key> <arg_value>V</arg_value> ... </tool_call>;
- `qwen3_coder` (Qwen3-Coder): <tool_call> <function=NAME> <parameter=K> V </parameter> ...
  </function> </tool_call>;
- `minimax_m2` (MiniMax-M2): <minimax:tool_call> <invoke name="NAME"> <parameter name="K">V</parameter>
  ... </invoke> ... </minimax:tool_call>;
- `mistral` (Mistral Small, Nemo, Devstral): [TOOL_CALLS] then a JSON list of {name, arguments}, or
  (tokenizers from v11) NAME[ARGS]{...} once per call, each after its own [TOOL_CALLS];
- `pythonic` (Llama 3.2 and 4's pythonic template): the reply is a Python list of calls,
  [get_weather(city="Paris"), get_time()], keyword arguments of literal values.
- `kimi_k2` (Kimi K2): <|tool_calls_section_begin|> <|tool_call_begin|>functions.NAME:INDEX
  <|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|> ... <|tool_calls_section_end|>; the
  call's id is the model's functions.NAME:INDEX (vLLM's too), which Kimi's chat template names
  the tool's result by.

The three XML-like formats write each argument as bare text, so its JSON type comes from the
request's tool declaration: a parameter declared as anything but a string is read as JSON where it
parses (5, true, [1, 2]), a string (or a parameter the tool does not declare) stays text. A call
counts once its block has closed; the content is the text before the first block's opening marker.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from pagoda_runtime.server.tools import FunctionCall, ParsedCall

# What reading a model's JSON can raise: besides malformed text, nesting deeper than Python's
# recursion limit ("[[[[..."), which a prompt can make a model write.
UNPARSED = (json.JSONDecodeError, RecursionError)
# A tool's name -> its JSON-schema parameters, as the request declares them.
Schemas = Mapping[str, Mapping[str, Any]]


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that could be the start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class BlockParser:
    """Calls in blocks that open with START; MARKERS: the markup a detokenizer must keep (where the
    tokenizer holds any of them as a special token, requests keep special tokens in their text)."""

    START: str = ""
    MARKERS: tuple[str, ...] = ()

    def __init__(self, schemas: Schemas | None = None) -> None:
        self.schemas = schemas or {}

    def content_end(self, text: str, final: bool) -> int:
        start = text.find(self.START)
        if start >= 0:
            return start
        return len(text) if final else len(text) - partial_suffix(text, self.START)

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        start = text.find(self.START)
        return [] if start < 0 else [call for call in self.block_calls(text[start:]) if call is not None]

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        raise NotImplementedError

    def typed_call(self, name: str, pairs: list[tuple[str, str]]) -> FunctionCall:
        """A call whose arguments arrive as (parameter, text) pairs, typed by the tool's schema."""
        properties = (self.schemas.get(name) or {}).get("properties") or {}
        arguments = {key: _argument(value, properties.get(key)) for key, value in pairs}
        return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _argument(text: str, schema: Any) -> Any:
    kind = schema.get("type", "string") if isinstance(schema, dict) else "string"
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return text
    try:
        return json.loads(text)
    except UNPARSED:
        return text


def _json_call(name: str, arguments: str) -> FunctionCall | None:
    """A call whose arguments are JSON text; None where they do not parse (the block is no call)."""
    try:
        json.loads(arguments)
    except UNPARSED:
        return None
    return FunctionCall(name=name.strip(), arguments=arguments.strip())


_CALLS_BEGIN, _CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_CALL_BEGIN, _CALL_END, _SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DEEPSEEK_MARKERS = (_CALLS_BEGIN, _CALLS_END, _CALL_BEGIN, _CALL_END, _SEP)


class DeepSeekV3Parser(BlockParser):
    START, MARKERS = _CALLS_BEGIN, _DEEPSEEK_MARKERS
    _CALL = re.compile(
        f"{re.escape(_CALL_BEGIN)}(.*?){re.escape(_SEP)}(.*?)\\s*```(?:json)?\\s*(.*?)\\s*```\\s*{re.escape(_CALL_END)}",
        re.S,
    )

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        return [_json_call(name, arguments) for _, name, arguments in self._CALL.findall(text)]


class DeepSeekV31Parser(BlockParser):
    START, MARKERS = _CALLS_BEGIN, _DEEPSEEK_MARKERS
    _CALL = re.compile(f"{re.escape(_CALL_BEGIN)}(.*?){re.escape(_SEP)}(.*?){re.escape(_CALL_END)}", re.S)

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        return [_json_call(name, arguments) for name, arguments in self._CALL.findall(text)]


class Glm45Parser(BlockParser):
    START = "<tool_call>"
    MARKERS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        found = []
        for block in self._BLOCK.findall(text):
            name = block.split("<arg_key>", 1)[0].strip()
            pairs = [(key.strip(), value) for key, value in self._PAIR.findall(block)]
            found.append(self.typed_call(name, pairs) if name else None)
        return found


def _parameters(pattern: re.Pattern, body: str) -> list[tuple[str, str]]:
    """(name, text) of each parameter `pattern` finds, without the one line break the markup puts
    on either side of a value."""
    return [
        (key.strip(), value.removeprefix("\n").removesuffix("\n")) for key, value in pattern.findall(body)
    ]


class Qwen3CoderParser(BlockParser):
    START, MARKERS = "<tool_call>", ("<tool_call>", "</tool_call>")
    _FUNCTION = re.compile(r"<tool_call>\s*<function=(.*?)>(.*?)</function>\s*</tool_call>", re.S)
    _PARAMETER = re.compile(r"<parameter=(.*?)>(.*?)</parameter>", re.S)

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        return [
            self.typed_call(name.strip(), _parameters(self._PARAMETER, body))
            for name, body in self._FUNCTION.findall(text)
        ]


class MiniMaxM2Parser(BlockParser):
    START, MARKERS = "<minimax:tool_call>", ("<minimax:tool_call>", "</minimax:tool_call>")
    _BLOCK = re.compile(r"<minimax:tool_call>(.*?)</minimax:tool_call>", re.S)
    _INVOKE = re.compile(r'<invoke name="(.*?)">(.*?)</invoke>', re.S)
    _PARAMETER = re.compile(r'<parameter name="(.*?)">(.*?)</parameter>', re.S)

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        return [
            self.typed_call(name.strip(), _parameters(self._PARAMETER, body))
            for block in self._BLOCK.findall(text)
            for name, body in self._INVOKE.findall(block)
        ]


_KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
_KIMI_CALL = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")


class KimiK2Parser(BlockParser):
    START, MARKERS = _KIMI_SECTION[0], (*_KIMI_SECTION, *_KIMI_CALL)
    _CALL = re.compile(r"\s*(.*?)\s*".join(map(re.escape, _KIMI_CALL)), re.S)

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        found = []
        for model_id, arguments in self._CALL.findall(text):
            # functions.NAME:INDEX; a name may hold dots or colons itself.
            name = model_id.removeprefix("functions.").rpartition(":")[0]
            call = _json_call(name, arguments) if name else None
            found.append(call and ParsedCall(name=call.name, arguments=call.arguments, id=model_id))
        return found


class MistralParser(BlockParser):
    """Its calls are read from the finished text: a JSON list cannot be told complete before."""

    START = "[TOOL_CALLS]"
    MARKERS = ("[TOOL_CALLS]", "[ARGS]")
    _NAMED = re.compile(r"\[TOOL_CALLS\]\s*([^\[\s]+?)\s*\[ARGS\]")

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        return super().calls(text, final) if final else []

    def block_calls(self, text: str) -> list[FunctionCall | None]:
        body = text.removeprefix(self.START).lstrip()
        if body.startswith("["):
            try:
                listed = json.loads(body)
            except UNPARSED:
                return []
            if not isinstance(listed, list):
                return []
            return [_listed_call(item) for item in listed]
        decoder, found = json.JSONDecoder(), []
        for match in self._NAMED.finditer(text):
            try:
                arguments, _ = decoder.raw_decode(text, match.end())
            except UNPARSED:
                found.append(None)
                continue
            found.append(
                FunctionCall(name=match.group(1), arguments=json.dumps(arguments, ensure_ascii=False))
            )
        return found


def _listed_call(item: Any) -> FunctionCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return FunctionCall(name=item["name"], arguments=text)


class PythonicParser:
    """The whole reply is the list of calls, or content: held back while it may still be one."""

    MARKERS = ("<|python_start|>", "<|python_end|>")

    def __init__(self, schemas: Schemas | None = None) -> None:
        del schemas  # the values are Python literals: their types are written out

    def _body(self, text: str) -> str:
        return text.strip().removeprefix(self.MARKERS[0]).removesuffix(self.MARKERS[1]).strip()

    def content_end(self, text: str, final: bool) -> int:
        head = text.lstrip()
        if final:
            return 0 if self.calls(text, True) else len(text)
        may_call = (
            not head or head.startswith("[") or self.MARKERS[0].startswith(head[: len(self.MARKERS[0])])
        )
        return 0 if may_call else len(text)

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        if not final:
            return []
        try:
            tree = ast.parse(self._body(text), mode="eval").body
        except SyntaxError:
            return []
        if not isinstance(tree, ast.List) or not tree.elts:
            return []
        found = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return []
            try:
                arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            except ValueError:
                return []
            if None in arguments:
                return []
            found.append(FunctionCall(name=node.func.id, arguments=json.dumps(arguments, ensure_ascii=False)))
        return found
