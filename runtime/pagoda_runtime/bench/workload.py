"""What an offline benchmark runs: the engine's settings for a random-weight shape, and the
requests (prompts as token ids, and how many tokens each generates)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OfflineConfig:
    shape: str
    device: str = "auto"
    dtype: str = "auto"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_cache_memory: float = 0.9
    enforce_eager: bool = False
    async_scheduling: bool | None = None  # None: the device's default (config.EngineConfig)
    seed: int = 0
    hf: bool = False
    result_json: str | None = None


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
