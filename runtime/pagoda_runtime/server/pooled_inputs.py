"""The body the pooling endpoints that take texts or token ids share (/v1/embeddings, /classify), as
OpenAI's embeddings API and vLLM take it: a text, token ids, or a list of either, at most
MAX_COMPLETIONS of them a request."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, field_validator

from pagoda_runtime.engine.protocol import ServingEngine
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import truncated
from pagoda_runtime.server.protocol import MAX_COMPLETIONS, TokenId, Truncation, ValidText, token_ids_in_range


class PooledInputRequest(ValidText, Truncation):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    user: str | None = None  # OpenAI's end-user id, for their abuse monitoring: nothing to do here
    add_special_tokens: bool = True  # vLLM's: BOS and the like, as the tokenizer adds them

    @field_validator("input", mode="before")
    @classmethod
    def _token_ids_in_range(cls, value: Any) -> Any:
        return token_ids_in_range(value)

    def inputs(self, verb: str) -> list[str | list[int]]:
        """The one input or each of the listed ones (a list of ints is one input of token ids); a
        400 naming `input` for none or too many (`verb`: what the endpoint does to them)."""
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            return [self.input]
        inputs = list(self.input)
        if not inputs:
            raise APIError(
                400, "input is an empty list; give at least one text or list of token ids.", param="input"
            )
        if len(inputs) > MAX_COMPLETIONS:
            raise APIError(
                400,
                f"input lists {len(inputs)} inputs, more than the {MAX_COMPLETIONS} one request may {verb}; "
                "split them over several requests.",
                param="input",
            )
        return inputs

    def prompts(self, inputs: list[str | list[int]], engine: ServingEngine) -> list[list[int]]:
        """Each input's token ids, truncated as asked."""
        return [
            truncated(
                engine.tokenizer.encode(text, self.add_special_tokens)
                if isinstance(text, str)
                else list(text),
                self,
                pooled_prompt_limit(engine),
            )
            for text in inputs
        ]


def pooled_prompt_limit(engine: ServingEngine) -> int:
    """The most prompt tokens a pooled request runs: the context less the one hidden token that ends
    its run (engine/pooler.py); what truncate_prompt_tokens -1 keeps."""
    return engine.max_model_len - 1
