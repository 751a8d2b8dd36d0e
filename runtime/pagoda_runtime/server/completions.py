"""POST /v1/completions: a text prompt (or token ids), or a list of them, in; n completions of each
out, whole or streamed."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

from fastapi import Request

from pagoda_runtime.engine.outputs import CompletionOutput, RequestOutput
from pagoda_runtime.engine.protocol import ChatTokenizer
from pagoda_runtime.server import sse
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.constraints import structured_outputs
from pagoda_runtime.server.generation import (
    generate,
    request_defaults,
    respond,
    sampling_params,
    truncated,
    usage,
)
from pagoda_runtime.server.logprobs import completion_logprobs, prompt_logprobs
from pagoda_runtime.server.merged_outputs import finals, merged
from pagoda_runtime.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse, UsageInfo
from pagoda_runtime.server.state import ServerState


@dataclass(frozen=True)
class _Prompt:
    ids: list[int]
    echoed: str  # what echo puts before its completions: the prompt as written, or as the model saw it


def _prompt(
    prompt: str | list[int], body: CompletionRequest, tokenizer: ChatTokenizer, max_model_len: int
) -> _Prompt:
    """A prompt's token ids (whether they fit the model is the engine's check) and its echo."""
    ids = tokenizer.encode(prompt, body.add_special_tokens) if isinstance(prompt, str) else list(prompt)
    ids = truncated(ids, body, max_model_len)
    if not body.echo:
        return _Prompt(ids, "")
    as_written = isinstance(prompt, str) and body.truncate_prompt_tokens is None
    return _Prompt(ids, prompt if as_written else tokenizer.decode(ids))


def _total(usages: list[UsageInfo]) -> UsageInfo:
    prompt, completion = sum(u.prompt_tokens for u in usages), sum(u.completion_tokens for u in usages)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


async def create_completion(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    lora_name = check_model(state, body.model, request)
    engine = await admit(state, body.priority)
    tokenizer = engine.tokenizer
    prompts = [_prompt(p, body, tokenizer, engine.max_model_len) for p in body.prompts()]
    # An echo with logprobs reports the prompt tokens' too: the engine computes them once for both.
    asked = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
    # The prompt alone as the answer: one token is computed (the prompt's last logits need a step)
    # and never shown, as vLLM does.
    prompt_only = body.scores_prompt_only()
    max_tokens = 1 if prompt_only else body.max_tokens
    constraint = structured_outputs(body)
    defaults = request_defaults(state, engine)
    params = sampling_params(body, max_tokens, body.logprobs, constraint, max(asked, default=None), defaults)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    as_ids = body.tokens_as_ids(state.settings)
    n = body.n  # a prompt's samples are choices p * n .. p * n + n - 1, as vLLM numbers them

    def logprobs(prompt: _Prompt, token_ids, token_logprobs, offset, out: RequestOutput | None = None):
        """Of the tokens; with `out`, after those of its echoed prompt."""
        if body.logprobs is None:
            return None
        listed = partial(completion_logprobs, tokenizer, top_n=body.logprobs, as_ids=as_ids)
        before = None
        if out is not None and out.prompt_logprobs is not None:
            before = listed(prompt.ids, out.prompt_logprobs, text_offset=0)
        return listed(token_ids, token_logprobs, text_offset=offset, before=before)

    def shown(sample: CompletionOutput) -> tuple[str, list[int], list | None]:
        """The sample's text, tokens and logprobs the response shows."""
        return ("", [], []) if prompt_only else (sample.text, sample.token_ids, sample.logprobs)

    def whole(finals: list[RequestOutput]) -> CompletionResponse:
        choices = []
        for i, (prompt, final) in enumerate(zip(prompts, finals, strict=True)):
            echo = final if body.echo else None
            scored = prompt_logprobs(tokenizer, final, body.prompt_logprobs)
            for o in sorted(final.outputs, key=lambda o: o.index):
                text, token_ids, token_logprobs = shown(o)
                choices.append(
                    CompletionChoice(
                        index=i * n + o.index,
                        text=prompt.echoed + text,
                        logprobs=logprobs(prompt, token_ids, token_logprobs, len(prompt.echoed), echo),
                        finish_reason=o.finish_reason,
                        prompt_logprobs=scored,
                        prompt_token_ids=prompt.ids if body.return_token_ids else None,
                        token_ids=token_ids if body.return_token_ids else None,
                    )
                )
        total = _total([usage(f, not prompt_only) for f in finals])
        return CompletionResponse(id=request_id, created=created, model=model, choices=choices, usage=total)

    async def stream(outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[bytes]:
        offsets = [0] * (len(prompts) * n)
        unsent = set(range(len(prompts) * n))  # choices whose first chunk is still to send (with the prompt)
        last: list[RequestOutput | None] = [None] * len(prompts)
        async for i, out in outputs:
            last[i] = out
            prompt = prompts[i]
            choices = []
            for delta in out.delta or ():
                index = i * n + delta.index
                first = index in unsent
                unsent.discard(index)
                echo = out if first and body.echo else None
                prefix = prompt.echoed if echo is not None else ""
                offset = offsets[index] + len(prefix)
                text, token_ids, token_logprobs = shown(delta)
                choices.append(
                    CompletionChoice(
                        index=index,
                        text=prefix + text,
                        logprobs=logprobs(prompt, token_ids, token_logprobs, offset, echo),
                        finish_reason=delta.finish_reason,
                        prompt_token_ids=prompt.ids if first and body.return_token_ids else None,
                        token_ids=token_ids if body.return_token_ids else None,
                    )
                )
                offsets[index] = offset + len(text)
            if choices:
                chunk = CompletionResponse(id=request_id, created=created, model=model, choices=choices)
                yield sse.event(chunk, exclude=None if include_usage else {"usage"})
        if include_usage:
            total = _total([usage(out, not prompt_only) for out in last])
            yield sse.event(
                CompletionResponse(id=request_id, created=created, model=model, choices=[], usage=total)
            )

    streams = [
        generate(
            state,
            engine,
            prompt.ids,
            params,
            request_id if len(prompts) == 1 else f"{request_id}-{i}",
            priority=body.priority,
            lora_name=lora_name,
        )
        for i, prompt in enumerate(prompts)
    ]
    outputs = merged(streams) if body.stream else finals(streams)
    return await respond(request, state, outputs, whole, stream if body.stream else None)
