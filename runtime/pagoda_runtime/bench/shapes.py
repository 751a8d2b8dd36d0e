"""Named model shapes with random weights, built in memory: benchmarks need no checkpoint.

The weights are drawn on the target device one tensor at a time, so an 8B model never sits in
host memory. Token ids carry no meaning, so the tokenizer is a bare vocabulary of the right size
and requests run with detokenize=False.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import WordLevel

from pagoda_runtime.config import ModelConfig
from pagoda_runtime.model_catalogue import MODELS, model_config
from pagoda_runtime.model_source import LoadedModel
from pagoda_runtime.tokenizer import Tokenizer
from pagoda_runtime.weight_layout import expected_weight_shapes

# Every model of the catalogue, and one small enough for the benchmark's own tests on the CPU.
SHAPES: dict[str, ModelConfig] = {
    **MODELS,
    "tiny-llama": model_config("llama", 2, 64, 128, 4, 2, 16, 512, False, 2048, 10000.0),
}


def shape_config(name: str) -> ModelConfig:
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
    return SHAPES[name]


def random_weights(
    config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, shape in expected_weight_shapes(config).items():
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, device=device, dtype=dtype)
        else:
            # Small enough that activations stay finite through every layer.
            yield name, (torch.randn(shape, device=device, generator=generator) * 0.02).to(dtype)


def bare_tokenizer(vocab_size: int) -> Tokenizer:
    vocab = {f"<{i}>": i for i in range(vocab_size)}
    backend = BackendTokenizer(WordLevel(vocab, unk_token="<0>"))
    return Tokenizer(
        backend, source="random", bos_token=None, eos_token=None, eos_token_ids=(), chat_template=None
    )


def random_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    config = shape_config(name)
    return LoadedModel(config, random_weights(config, device, dtype, seed), bare_tokenizer(config.vocab_size))
