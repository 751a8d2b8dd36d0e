"""A conversation to prompt token ids through the model's chat template: the one rule behind the
chat endpoint, /tokenize and the offline LLM.chat, with vLLM's options (template variables such as
Qwen 3's enable_thinking, no assistant turn opened, or the final message continued: a reply the
client prefilled)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from pagoda_runtime.engine.protocol import ChatTokenizer

# What the renderer itself gives the template; chat_template_kwargs may not replace them.
_RENDERER_VARIABLES = frozenset(
    {"messages", "tools", "documents", "reasoning_effort", "add_generation_prompt", "bos_token", "eos_token"}
)


class ChatPromptError(ValueError):
    """A conversation or option the template cannot render; `param` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _content_text(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _open_ended(rendered: str, final: Mapping[str, Any]) -> str:
    """The rendered conversation cut right after the final message's text, so that the model goes
    on with it instead of after its end-of-turn (templates may strip the text: then its stripped
    form is looked for)."""
    for text in (_content_text(final), _content_text(final).strip()):
        if text and (at := rendered.rfind(text)) >= 0:
            return rendered[: at + len(text)]
    raise ChatPromptError(
        "continue_final_message needs a final message whose text the chat template writes out; "
        "give the final message some content",
        "continue_final_message",
    )


def chat_prompt_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
    documents: list[dict[str, str]] | None = None,
    reasoning_effort: str | None = None,
) -> list[int]:
    """messages: as the template reads them ({"role", "content", ...}); tools in OpenAI's shape;
    documents for templates that write retrieved documents (RAG), as vLLM hands them over;
    reasoning_effort for templates that read it, and "none" of it turns thinking off (Qwen 3's
    enable_thinking) unless template_kwargs sets that itself."""
    if continue_final_message and add_generation_prompt:
        raise ChatPromptError(
            "continue_final_message goes on with the last message and add_generation_prompt starts a "
            "new one; set add_generation_prompt to false",
            "continue_final_message",
        )
    clashing = sorted(_RENDERER_VARIABLES & set(template_kwargs or ()))
    if clashing:
        raise ChatPromptError(
            f"chat_template_kwargs cannot set {', '.join(clashing)}; use the request's own fields",
            "chat_template_kwargs",
        )
    variables = dict(template_kwargs or {}) | ({"tools": tools} if tools else {})
    if documents is not None:
        variables["documents"] = documents
    if reasoning_effort is not None:
        variables["reasoning_effort"] = reasoning_effort
        variables.setdefault("enable_thinking", reasoning_effort != "none")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt, **variables)
    except (ValueError, TypeError, jinja2.TemplateError) as exc:
        # No template, or the template itself rejects the conversation (e.g. roles must alternate).
        raise ChatPromptError(
            f"The messages cannot be rendered with the model's chat template: {exc}", "messages"
        ) from exc
    if continue_final_message:
        text = _open_ended(text, messages[-1])
    # The template already writes the special tokens (BOS included) where the model expects them.
    return tokenizer.encode(text, add_special_tokens=False)
