"""POST /v1/completions: a text prompt (or token ids) in, n completions out, whole or streamed."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from pagoda_runtime.engine.outputs import CompletionOutput, RequestOutput
from pagoda_runtime.engine.protocol import ChatTokenizer
from pagoda_runtime.server import sse
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.constraints import structured_outputs
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond, sampling_params, truncated, usage
from pagoda_runtime.server.logprobs import completion_logprobs, prompt_logprobs
from pagoda_runtime.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from pagoda_runtime.server.state import ServerState


def prompt_token_ids(
    prompt: str | list[int] | list[str] | list[list[int]],
    tokenizer: ChatTokenizer,
    add_special_tokens: bool = True,
) -> list[int]:
    """The one prompt's token ids; whether they fit the model is the engine's check."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(
                400,
                f"Batched prompts ({len(prompt)}) are not supported; send one request per prompt.",
                param="prompt",
            )
        prompt = prompt[0]
    return tokenizer.encode(prompt, add_special_tokens) if isinstance(prompt, str) else list(prompt)


def _echoed_text(prompt: str | list[int] | list[str] | list[list[int]], ids: list[int], tokenizer) -> str:
    """The prompt as the request wrote it: its text, or its token ids decoded."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids)


async def create_completion(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    lora_name = check_model(state, body.model, request)
    engine = await admit(state, body.priority)
    ids = prompt_token_ids(body.prompt, engine.tokenizer, body.add_special_tokens)
    ids = truncated(ids, body, engine.max_model_len)
    # An echo with logprobs reports the prompt tokens' too: the engine computes them once for both.
    asked = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
    # The prompt alone as the answer: one token is computed (the prompt's last logits need a step)
    # and never shown, as vLLM does.
    prompt_only = body.scores_prompt_only()
    max_tokens = 1 if prompt_only else body.max_tokens
    constraint = structured_outputs(body)
    params = sampling_params(body, max_tokens, body.logprobs, constraint, max(asked, default=None))
    echoed = ""
    if body.echo:  # a truncated prompt is echoed as what the model saw
        whole_prompt = body.prompt if body.truncate_prompt_tokens is None else ids
        echoed = _echoed_text(whole_prompt, ids, engine.tokenizer)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    def logprobs(token_ids, token_logprobs, offset, out: RequestOutput | None = None):
        """Of the tokens; with `out`, after those of its echoed prompt."""
        if body.logprobs is None:
            return None
        before = None
        if out is not None and out.prompt_logprobs is not None:
            before = completion_logprobs(engine.tokenizer, ids, out.prompt_logprobs, body.logprobs, 0)
        return completion_logprobs(engine.tokenizer, token_ids, token_logprobs, body.logprobs, offset, before)

    def shown(sample: CompletionOutput) -> tuple[str, list[int], list | None]:
        """The sample's text, tokens and logprobs the response shows."""
        return ("", [], []) if prompt_only else (sample.text, sample.token_ids, sample.logprobs)

    def whole(final: RequestOutput) -> CompletionResponse:
        echo = final if body.echo else None
        scored = prompt_logprobs(engine.tokenizer, final, body.prompt_logprobs)
        choices = []
        for o in sorted(final.outputs, key=lambda o: o.index):
            text, token_ids, token_logprobs = shown(o)
            choices.append(
                CompletionChoice(
                    index=o.index,
                    text=echoed + text,
                    logprobs=logprobs(token_ids, token_logprobs, len(echoed), echo),
                    finish_reason=o.finish_reason,
                    prompt_logprobs=scored,
                    prompt_token_ids=ids if body.return_token_ids else None,
                    token_ids=token_ids if body.return_token_ids else None,
                )
            )
        return CompletionResponse(
            id=request_id, created=created, model=model, choices=choices, usage=usage(final, not prompt_only)
        )

    async def stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        offsets = [0] * body.n
        unsent = set(range(body.n))  # choices whose first chunk is still to send (with the prompt)
        out = None
        async for out in outputs:
            choices = []
            for delta in out.delta or ():
                first = delta.index in unsent
                unsent.discard(delta.index)
                echo = out if first and body.echo else None
                prefix = echoed if echo is not None else ""
                offset = offsets[delta.index] + len(prefix)
                text, token_ids, token_logprobs = shown(delta)
                choices.append(
                    CompletionChoice(
                        index=delta.index,
                        text=prefix + text,
                        logprobs=logprobs(token_ids, token_logprobs, offset, echo),
                        finish_reason=delta.finish_reason,
                        prompt_token_ids=ids if first and body.return_token_ids else None,
                        token_ids=token_ids if body.return_token_ids else None,
                    )
                )
                offsets[delta.index] = offset + len(text)
            if choices:
                chunk = CompletionResponse(id=request_id, created=created, model=model, choices=choices)
                yield sse.event(chunk, exclude=None if include_usage else {"usage"})
        if include_usage:
            yield sse.event(
                CompletionResponse(
                    id=request_id, created=created, model=model, choices=[], usage=usage(out, not prompt_only)
                )
            )

    outputs = generate(state, engine, ids, params, request_id, priority=body.priority, lora_name=lora_name)
    return await respond(request, state, outputs, whole, stream if body.stream else None)
