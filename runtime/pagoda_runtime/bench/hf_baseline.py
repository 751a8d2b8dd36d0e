"""The anchor: Hugging Face transformers' `generate` with static batching, on the same shape,
device and dtype as the engine, with random weights of its own.

A static batch pads every prompt to the longest and runs until its longest output is done, so a
request's useful tokens are only its own output length: that is what the rates count. Sampling
is plain temperature sampling (no top-k, no top-p), as the engine's; temperature 0 is greedy.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from pagoda_runtime.bench.workload import OfflineConfig, Workload
from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.model_catalogue import shape_config
from pagoda_runtime.executor.devices import resolve_device, resolve_dtype

_DENSE_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def hf_config(config: ModelConfig, **overrides):
    """transformers' config for the same architecture; `overrides` go to its constructor."""
    from transformers import LlamaConfig, Qwen2Config

    # The architecture's fields are transformers' own names; these two families use the dense
    # decoder's (no windows, experts or layer types); Qwen2 always has q, k and v biases.
    architecture = {name: getattr(config.architecture, name) for name in _DENSE_FIELDS}
    attention_bias = config.architecture.attention_bias
    common = dict(
        **architecture,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        **overrides,
    )
    rope = config.rope_scaling
    if rope is not None:
        common["rope_scaling"] = {"rope_type": rope.rope_type, "factor": rope.factor}
        if rope.rope_type == "llama3":
            common["rope_scaling"] |= {
                "low_freq_factor": rope.low_freq_factor,
                "high_freq_factor": rope.high_freq_factor,
                "original_max_position_embeddings": rope.original_max_position_embeddings,
            }
    if config.model_type == "qwen2":
        return Qwen2Config(**common)
    return LlamaConfig(**common, attention_bias=attention_bias)


def _model(offline: OfflineConfig):
    from transformers import AutoModelForCausalLM

    device = resolve_device(offline.engine.device)
    dtype = resolve_dtype(offline.engine.dtype, device)
    torch.manual_seed(offline.engine.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(shape_config(offline.shape)), dtype=dtype)
    return model.eval(), device


def _generate(
    model, device: torch.device, prompts: list[list[int]], new_tokens: int, temperature: float = 0.0
) -> None:
    width = max(len(p) for p in prompts)
    # Left padding, as generate expects for decoder-only models.
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    sampling = {"do_sample": False}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            **sampling,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release() -> None:
    """Hand the freed model's memory back to the device, so the engine's KV budget can use it."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class ThroughputRun:
    num_prompts: int  # the first num_prompts requests of the workload
    batch_size: int  # requests per static batch, in the workload's order
    output_tokens: int  # useful: each request's own output length
    seconds: float

    @property
    def output_tok_per_s(self) -> float:
        return self.output_tokens / self.seconds


def throughput(
    offline: OfflineConfig, workload: Workload, num_prompts: int, batch: int, temperature: float
) -> ThroughputRun:
    """The first `num_prompts` requests, `batch` at a time, sampled at `temperature`."""
    model, device = _model(offline)
    _generate(model, device, workload.prompts[:1], 4, temperature)
    useful = 0
    start = time.perf_counter()
    for first in range(0, num_prompts, batch):
        prompts = workload.prompts[first : min(first + batch, num_prompts)]
        lens = workload.output_lens[first : first + len(prompts)]
        _generate(model, device, prompts, max(lens), temperature)
        useful += sum(lens)
    seconds = time.perf_counter() - start
    del model
    _release()
    return ThroughputRun(num_prompts, batch, useful, seconds)


def latency(offline: OfflineConfig, workload: Workload) -> float:
    """Output tokens per second over the whole batch (prefill included, as a user would see it)."""
    model, device = _model(offline)
    _generate(model, device, workload.prompts[:1], 4)
    start = time.perf_counter()
    _generate(model, device, workload.prompts, workload.output_lens[0])
    seconds = time.perf_counter() - start
    del model
    _release()
    return len(workload.prompts) * workload.output_lens[0] / seconds
