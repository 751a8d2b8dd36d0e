"""A reasoning model's thinking told from its answer, as vLLM's --reasoning-parser does: the text
between <think> and </think> is the reply's reasoning (reasoning_content, and reasoning as newer
clients read it), the rest its content, which the tool-call parser then reads. GPT-OSS speaks
OpenAI's harmony format instead (`openai_gptoss`, split_harmony below).

Where the reply starts is read from the prompt rather than guessed per model: a chat template that
opens a think block for the model (DeepSeek-R1, QwQ, Qwen3's thinking-only models) leaves the
reply inside it, so the reply is reasoning until </think>; otherwise (Qwen3 and SmolLM3 in their
hybrid mode) it is content unless it opens a block itself, and a template that closed an empty
block (Qwen3 with enable_thinking false) leaves it content. The names are vLLM's; all but
openai_gptoss read the same tags (contract/serve_settings.REASONING_PARSERS). A reply whose output
a grammar fixes (structured output, a forced tool call) is all content. The split is a function of
the text so far, which only grows: streamed pieces add up to the whole reply's split.
"""

from __future__ import annotations

from collections.abc import Callable

START, END = "<think>", "</think>"
HARMONY_PARSER = "openai_gptoss"
# Harmony's markers: each is one special token of GPT-OSS's vocabulary.
_H_START, _H_CHANNEL, _H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
_H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
# A message to a tool stays in the content as HARMONY_CALL + recipient + <|message|> + arguments,
# for the openai tool-call parser (tool_parsers.HarmonyParser) to read.
HARMONY_CALL, HARMONY_ARGUMENTS = "<|call|>", "<|message|>"
_TOOL_PREFIX = "functions."
_H_MARKERS = (_H_START, _H_CHANNEL, _H_MESSAGE, "<|constrain|>", *_H_ENDS)
_REASONING_CHANNEL = "analysis"

# (reply text so far, whether it is whole) -> (reasoning, content) as far as decided.
Split = Callable[[str, bool], tuple[str, str]]


def reply_split(parser: str, prompt_tail: str) -> Split:
    """How --reasoning-parser `parser` splits a reply to a prompt ending in `prompt_tail`."""
    if parser == HARMONY_PARSER:
        return split_harmony
    thinking = starts_in_reasoning(prompt_tail)
    return lambda text, final: split_reasoning(text, thinking, final)


def starts_in_reasoning(prompt_tail: str) -> bool:
    """Whether the prompt (its last tokens, as text) leaves the reply inside an open think block."""
    opened = prompt_tail.rfind(START)
    return opened >= 0 and END not in prompt_tail[opened:]


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may be the start of one of `markers`."""
    for n in range(min(max(map(len, markers)) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def split_harmony(text: str, final: bool) -> tuple[str, str]:
    """(reasoning, content) of a GPT-OSS reply in harmony, its special tokens kept in the text: a run
    of messages, each <|channel|>NAME[ to=...][<|constrain|>...]<|message|>BODY ended by <|end|>,
    <|call|> or <|return|>, the next opened by <|start|>assistant. The analysis channel's bodies are
    the reasoning, every other channel's (final, commentary preambles) the content, and a message to
    a function (to=functions.NAME, in its role or its channel header) a HARMONY_CALL segment of the
    content; text outside any message (a reply that does not speak harmony) is content. Unless
    `final`, a tail that may be the start of a marker, and a header not yet ended by <|message|>,
    are held back."""
    if not final:
        text = text[: len(text) - _held_back(text, _H_MARKERS)]
    reasoning, content = [], []
    pos, recipient = 0, None
    while pos < len(text):
        if text.startswith(_H_START, pos):  # <|start|>ROLE, the role up to the channel or message
            heads = [i for i in (text.find(_H_CHANNEL, pos), text.find(_H_MESSAGE, pos)) if i >= 0]
            if not heads:
                break
            recipient = _recipient(text[pos + len(_H_START) : min(heads)])
            pos = min(heads)
            continue
        channel = "final"
        if text.startswith(_H_CHANNEL, pos):
            body_at = text.find(_H_MESSAGE, pos)
            if body_at < 0:
                break
            header = text[pos + len(_H_CHANNEL) : body_at]
            recipient = recipient or _recipient(header)
            words = header.split("<|constrain|>")[0].split()
            channel = words[0] if words else "final"
            pos = body_at + len(_H_MESSAGE)
        elif text.startswith(_H_MESSAGE, pos):
            pos += len(_H_MESSAGE)
        ends = [i for i in (text.find(m, pos) for m in (*_H_ENDS, _H_START, _H_CHANNEL)) if i >= 0]
        end = min(ends, default=len(text))
        if recipient is not None:
            content.append(f"{HARMONY_CALL}{recipient}{HARMONY_ARGUMENTS}{text[pos:end]}")
        else:
            (reasoning if channel == _REASONING_CHANNEL else content).append(text[pos:end])
        recipient = None
        pos = end
        for marker in _H_ENDS:
            if text.startswith(marker, pos):
                pos += len(marker)
                break
    return "".join(reasoning), "".join(content)


def _recipient(header: str) -> str | None:
    """The function a harmony message header addresses (to=functions.NAME), or None."""
    for word in header.replace("<|constrain|>", " ").split():
        if word.startswith("to=" + _TOOL_PREFIX):
            return word.removeprefix("to=" + _TOOL_PREFIX)
    return None


def split_reasoning(text: str, thinking: bool, final: bool) -> tuple[str, str]:
    """(reasoning, content) of a reply's text so far, as far as it is decided: unless `final`, a
    tail that may be the start of a tag is held back. `thinking`: the reply starts inside a think
    block (starts_in_reasoning)."""
    if not thinking:
        stripped = text.lstrip()
        if not stripped.startswith(START):
            undecided = not final and START.startswith(stripped)
            return "", "" if undecided else text
        text = stripped[len(START) :]
    end = text.find(END)
    if end >= 0:
        return text[:end], text[end + len(END) :]
    if final:
        return text, ""
    return text[: len(text) - _held_back(text, (END,))], ""


class ReasoningStream:
    """One streamed reply's reasoning and content, each as the pieces not yet sent."""

    def __init__(self, split: Split) -> None:
        self.split = split
        self.sent_reasoning = 0
        self.content = ""  # the content decided so far, whole (the tool-call parser reads it whole)

    def feed(self, text: str, final: bool) -> str:
        """The reasoning not yet sent, given the reply's whole text so far; updates `content`."""
        reasoning, self.content = self.split(text, final)
        new, self.sent_reasoning = reasoning[self.sent_reasoning :], max(self.sent_reasoning, len(reasoning))
        return new
