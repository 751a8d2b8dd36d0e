"""How one request wants its tokens chosen and when it stops; validated once, at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda_runtime.engine.structured_outputs import StructuredOutputs

# What a running request's RequestOutputs hold. cumulative: every sample's whole output so far, in
# each one. delta: only the step's new tokens (`delta`); the final output still holds the whole of
# each sample. Copying every sample's whole output at every step costs host time that grows with
# the output's length, so callers that read deltas (the server) or only the final output ask for delta.
OUTPUT_KINDS = ("cumulative", "delta")
# The knobs a model's generation_config.json recommends values for, under the same names there,
# which the server takes for what a request leaves out (vLLM's --generation-config auto).
MODEL_DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no limit
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token; 0 = only the chosen one
    # The same for each prompt token after the first (executor/prompt_logprobs.py), as vLLM's.
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # {token id: value} added to those tokens' logits before sampling, as OpenAI's logit_bias: -100
    # all but bans a token, 100 all but forces it.
    logit_bias: dict[int, float] | None = None
    # vLLM's: only these tokens may be sampled (every other logit masked).
    allowed_token_ids: list[int] | None = None
    # vLLM's: words never generated (engine/bad_words.py says how they are matched).
    bad_words: list[str] | None = None
    # False: token ids only, no text (benchmarks of random-weight models have no real vocabulary).
    detokenize: bool = True
    structured_outputs: StructuredOutputs | None = None
    # Only requests with the same salt share prefix-cache blocks (engine/block_manager.py), as vLLM.
    cache_salt: str | None = None
    output_kind: str = "cumulative"  # one of OUTPUT_KINDS

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                f"max_tokens must be at least 1, got {self.max_tokens}",
            ),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be -1, 0 or positive, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                -2.0 <= self.presence_penalty <= 2.0,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                self.repetition_penalty > 0.0,
                f"repetition_penalty must be positive, got {self.repetition_penalty}",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= 20,
                f"logprobs must be in [0, 20], got {self.logprobs}",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}",
            ),
            (all(s for s in self.stop), "stop strings must not be empty"),
            (
                all(-100.0 <= v <= 100.0 for v in (self.logit_bias or {}).values()),
                "logit_bias values must be in [-100, 100]",
            ),
            (
                self.allowed_token_ids is None or bool(self.allowed_token_ids),
                "allowed_token_ids must not be empty; leave it out to allow every token",
            ),
            (self.cache_salt is None or bool(self.cache_salt), "cache_salt must not be empty"),
            (
                self.output_kind in OUTPUT_KINDS,
                f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {self.output_kind!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def token_id_fields(self) -> dict[str, list[int]]:
        """Each field that holds token ids, by name: request_validation checks them against the
        vocabulary, so that a field added here is checked too."""
        return {
            "stop_token_ids": self.stop_token_ids,
            "logit_bias": list(self.logit_bias or ()),
            "allowed_token_ids": self.allowed_token_ids or [],
        }

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
