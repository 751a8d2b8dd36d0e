"""POST /tokenize and /detokenize, as vLLM serves them: a prompt or chat messages to token ids
through the served model's own tokenizer (and chat template), and token ids back to text."""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, model_validator

from pagoda_runtime.engine.request_validation import first_out_of_vocabulary
from pagoda_runtime.server.admission import check_model
from pagoda_runtime.server.chat_turn import chat_prompt_ids
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.protocol import ChatMessage, ChatTemplateOptions, TokenId, ValidText
from pagoda_runtime.server.state import ServerState
from pagoda_runtime.server.tools import ToolDefinition


class TokenizeRequest(ValidText, ChatTemplateOptions):
    """Either prompt (a plain text) or messages (rendered with the chat template, as the chat
    endpoint renders them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDefinition] | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


def _engine(state: ServerState):
    if state.engine is None:
        raise APIError(503, "The model is still loading; retry shortly.", code="not_ready", retry_after=5)
    return state.engine


async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    state: ServerState = request.app.state.pagoda
    check_model(state, body.model, request)
    engine = _engine(state)
    tokenizer = engine.tokenizer
    if body.messages is not None:
        ids = chat_prompt_ids(body.messages, body.tools, body, tokenizer)
    else:
        ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    strs = [tokenizer.decode([t], skip_special_tokens=False) for t in ids] if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=engine.max_model_len, tokens=ids, token_strs=strs)


async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    state: ServerState = request.app.state.pagoda
    check_model(state, body.model, request)
    engine = _engine(state)
    vocab = engine.vocab_size
    bad = first_out_of_vocabulary(body.tokens, vocab)
    if bad is not None:
        message = f"Token id {bad} is outside the model's vocabulary of {vocab} tokens; check the tokenizer."
        raise APIError(400, message, param="tokens")
    return DetokenizeResponse(prompt=engine.tokenizer.decode(body.tokens))
