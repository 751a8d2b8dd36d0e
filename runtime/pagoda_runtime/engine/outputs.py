"""What the engine hands back: per request, per sample, with timings for the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

# Per generated token: the chosen token's logprob and the top-n alternatives {token_id: logprob}.
TokenLogprobs = dict[int, float]


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort"; None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it


@dataclass
class RequestMetrics:
    arrival_time: float  # time.monotonic() when the engine accepted the request
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """One request's state after a step: `delta` holds what the step added to each sample;
    `outputs` the whole of each sample, in a finished request's output and, while it runs, only
    when its SamplingParams.output_kind is "cumulative" (otherwise empty)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    delta: list[CompletionOutput] | None = None
    # With SamplingParams.prompt_logprobs: per prompt token, None for the first (nothing predicts
    # it), then {token_id: logprob} of the token and the top alternatives, once computed.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # With them, each prompt token's rank under the model (1: the likeliest), None for the first:
    # vLLM's Logprob.rank, which its API reports beside each prompt logprob.
    prompt_token_ranks: list[int | None] | None = None
    # Under --runner pooling, in the finished output: the prompt's embedding, or a classifier's
    # probabilities (engine/pooler.py).
    pooled: list[float] | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """LLM.embed's result for one prompt, as vLLM's: `outputs.embedding`."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ClassificationOutput:
    probs: list[float]


@dataclass
class ClassificationRequestOutput:
    """LLM.classify's result for one prompt, as vLLM's: `outputs.probs`, one per label."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """LLM.score's result for one pair, as vLLM's: `outputs.score`; `prompt_token_ids`: the pair's
    prompt (a cross-encoder), or both texts' (a bi-encoder)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
