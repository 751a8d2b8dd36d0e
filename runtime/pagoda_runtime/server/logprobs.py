"""Engine logprobs ({token_id: logprob} per token) in OpenAI's two formats and vLLM's
prompt_logprobs."""

from __future__ import annotations

from pagoda_runtime.engine.outputs import RequestOutput, TokenLogprobs
from pagoda_runtime.server.protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    TokenLogprob,
    TopLogprob,
)

# JSON has no -Infinity; OpenAI-compatible servers report masked-out tokens with this floor instead.
_FLOOR = -9999.0


def _text(tokenizer, token_id: int) -> str:
    # Special tokens are shown as what they are, not dropped as they are from the completion text.
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _name(tokenizer, token_id: int, as_ids: bool) -> str:
    """How logprobs show a token: its text, or with return_tokens_as_token_ids vLLM's token_id:<id>
    (a token that is part of a UTF-8 character has no text of its own)."""
    return f"token_id:{token_id}" if as_ids else _text(tokenizer, token_id)


def _top(alternatives: TokenLogprobs, n: int) -> list[tuple[int, float]]:
    ranked = sorted(alternatives.items(), key=lambda item: item[1], reverse=True)[:n]
    return [(token_id, max(lp, _FLOOR)) for token_id, lp in ranked]


def completion_logprobs(
    tokenizer,
    token_ids: list[int],
    logprobs: list[TokenLogprobs | None],
    top_n: int,
    text_offset: int,
    before: CompletionLogprobs | None = None,
    as_ids: bool = False,
) -> CompletionLogprobs:
    """The legacy completions format, appended to `before` (an echoed prompt's) where given;
    text_offset is where these tokens start in the choice's text (shown as ids or not). A token
    without logprobs (a prompt's first, which nothing predicts) has nulls, as OpenAI's echo gives."""
    result = before or CompletionLogprobs()
    for token_id, alternatives in zip(token_ids, logprobs, strict=True):
        result.tokens.append(_name(tokenizer, token_id, as_ids))
        if alternatives is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
        else:
            result.token_logprobs.append(max(alternatives[token_id], _FLOOR))
            top = _top(alternatives, top_n)
            result.top_logprobs.append({_name(tokenizer, t, as_ids): lp for t, lp in top})
        result.text_offset.append(text_offset)
        text_offset += len(_text(tokenizer, token_id))
    return result


def chat_logprobs(
    tokenizer, token_ids: list[int], logprobs: list[TokenLogprobs], top_n: int, as_ids: bool = False
) -> ChatLogprobs:
    """OpenAI's chat format; `bytes` are always the token's text's, shown as an id or not."""
    content = []
    for token_id, alternatives in zip(token_ids, logprobs, strict=True):
        top = []
        for alt_id, alt_lp in _top(alternatives, top_n):
            alt = _name(tokenizer, alt_id, as_ids)
            top.append(TopLogprob(token=alt, logprob=alt_lp, bytes=list(_text(tokenizer, alt_id).encode())))
        content.append(
            TokenLogprob(
                token=_name(tokenizer, token_id, as_ids),
                logprob=max(alternatives[token_id], _FLOOR),
                bytes=list(_text(tokenizer, token_id).encode()),
                top_logprobs=top,
            )
        )
    return ChatLogprobs(content=content)


def prompt_logprobs(tokenizer, out: RequestOutput, top_n: int | None) -> PromptLogprobs | None:
    """vLLM's prompt_logprobs of a request that asked for top_n (None: it did not): per prompt token
    (None for the first) its own entry and the top_n likeliest, each once, keyed by token id; an
    alternative's rank is its place among them."""
    if top_n is None:
        return None
    result: PromptLogprobs = []
    for token_id, alternatives, rank in zip(
        out.prompt_token_ids, out.prompt_logprobs, out.prompt_token_ranks, strict=True
    ):
        if alternatives is None:
            result.append(None)
            continue
        own = max(alternatives[token_id], _FLOOR)
        text = _text(tokenizer, token_id)
        entry = {str(token_id): PromptLogprob(logprob=own, rank=rank, decoded_token=text)}
        for place, (alt, value) in enumerate(_top(alternatives, top_n), start=1):
            text = _text(tokenizer, alt)
            entry.setdefault(str(alt), PromptLogprob(logprob=value, rank=place, decoded_token=text))
        result.append(entry)
    return result
