"""Whether a tokenized request can run in this engine: the one place its prompt, its token ids and
its length are checked against the model.

The engine calls `check_request` before it accepts a request, for every caller alike (the offline
API, the server, the benchmarks). A refusal is a `RequestRejected` that says what was wrong, which
request field it was, and an OpenAI-style code, so the server turns it into a 400 without guessing.
Every token id a request carries is checked against the vocabulary here, so that none reaches a
tensor index it is outside of. Torch-free: the server's test double applies the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagoda_runtime.engine.sampling_params import SamplingParams


class RequestRejected(ValueError):
    """A request the engine will not run, in one sentence a user can act on."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault: "prompt", "max_tokens", "min_tokens", or None
        self.code = code  # "context_length_exceeded", or None


def first_out_of_vocabulary(token_ids: Sequence[int], vocab_size: int) -> int | None:
    return next((t for t in token_ids if not 0 <= t < vocab_size), None)


def check_request(
    token_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_model_len: int
) -> None:
    """Raises RequestRejected unless the prompt and every token id in `params` are valid and prompt
    plus completion fit the context.

    The engine caps max_model_len to what its KV cache holds (engine_build.py), so a request that
    fits the context fits the cache."""
    max_tokens, min_tokens = params.max_tokens, params.min_tokens
    n = len(token_ids)
    if not n:
        raise RequestRejected("The prompt is empty; send at least one token.", param="prompt")
    bad = first_out_of_vocabulary(token_ids, vocab_size)
    if bad is not None:
        raise RequestRejected(
            f"Prompt token id {bad} is outside the model's vocabulary of {vocab_size} tokens; "
            "check the tokenizer.",
            param="prompt",
        )
    for field, ids in params.token_id_fields().items():
        bad = first_out_of_vocabulary(ids, vocab_size)
        if bad is not None:
            raise RequestRejected(
                f"{field} holds token id {bad}, which is outside the model's vocabulary of {vocab_size} "
                f"tokens (ids 0 to {vocab_size - 1}); remove it.",
                param=field,
            )
    if n >= max_model_len:
        raise RequestRejected(
            f"This model's maximum context length (max_model_len) is {max_model_len} tokens, but the "
            f"prompt has {n} tokens, leaving no room to generate; shorten the prompt.",
            param="prompt",
            code="context_length_exceeded",
        )
    if max_tokens is not None and n + max_tokens > max_model_len:
        raise RequestRejected(
            f"This model's maximum context length (max_model_len) is {max_model_len} tokens, but you "
            f"requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} in the completion); "
            "shorten the prompt or lower max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if max_tokens is None and min_tokens > max_model_len - n:
        raise RequestRejected(
            f"min_tokens ({min_tokens}) exceeds the {max_model_len - n} tokens the context leaves "
            "after the prompt; lower min_tokens.",
            param="min_tokens",
        )
