"""A reasoning model's thinking told from its answer, as vLLM's --reasoning-parser does: the text
between <think> and </think> is the reply's reasoning (reasoning_content, and reasoning as newer
clients read it), the rest its content, which the tool-call parser then reads.

Where the reply starts is read from the prompt rather than guessed per model: a chat template that
opens a think block for the model (DeepSeek-R1, QwQ, Qwen3's thinking-only models) leaves the
reply inside it, so the reply is reasoning until </think>; otherwise (Qwen3 and SmolLM3 in their
hybrid mode) it is content unless it opens a block itself, and a template that closed an empty
block (Qwen3 with enable_thinking false) leaves it content. The names are vLLM's; both parsers
read the same tags. A reply whose output a grammar fixes (structured output, a forced tool call)
is all content. The split is a function of the text so far, which only grows: streamed pieces add
up to the whole reply's split.
"""

from __future__ import annotations

START, END = "<think>", "</think>"


def starts_in_reasoning(prompt_tail: str) -> bool:
    """Whether the prompt (its last tokens, as text) leaves the reply inside an open think block."""
    opened = prompt_tail.rfind(START)
    return opened >= 0 and END not in prompt_tail[opened:]


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
    held = next((n for n in range(min(len(END) - 1, len(text)), 0, -1) if END.startswith(text[-n:])), 0)
    return text[: len(text) - held], ""


class ReasoningStream:
    """One streamed reply's reasoning and content, each as the pieces not yet sent."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.sent_reasoning = 0
        self.content = ""  # the content decided so far, whole (the tool-call parser reads it whole)

    def feed(self, text: str, final: bool) -> str:
        """The reasoning not yet sent, given the reply's whole text so far; updates `content`."""
        reasoning, self.content = split_reasoning(text, self.thinking, final)
        new, self.sent_reasoning = reasoning[self.sent_reasoning :], max(self.sent_reasoning, len(reasoning))
        return new
