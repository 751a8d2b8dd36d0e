"""What an offline benchmark runs: the engine's settings for a random-weight shape, and the
requests (prompts as token ids, and how many tokens each generates)."""

from __future__ import annotations

from dataclasses import dataclass

from pagoda_runtime.contract.config import EngineConfig

# The engine flags `bench throughput|latency` take, as `serve` declares them (EngineConfig); the
# model is --shape, and the benchmark sets the context length and leaves out prefix caching.
OFFLINE_ENGINE_FLAGS = (
    "device",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_memory",
    "enforce_eager",
    "async_scheduling",
    "seed",
)
# Random weights are float weights, which --quantization auto serves as none; the reports name it.
OFFLINE_QUANTIZATION = "none"


@dataclass(frozen=True)
class OfflineConfig:
    engine: EngineConfig  # engine.model names the shape (model_catalogue.SHAPES) of the random weights
    hf: bool = False  # also run Hugging Face transformers' generate on the same shape

    @property
    def shape(self) -> str:
        return self.engine.model


def offline_engine(shape: str, **settings) -> EngineConfig:
    """The engine's config for random weights of `shape`, with the benchmarks' own defaults."""
    return EngineConfig(model=shape, **{"quantization": OFFLINE_QUANTIZATION, **settings})


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
