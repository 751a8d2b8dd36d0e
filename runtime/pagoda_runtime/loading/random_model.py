"""A model of a named shape (model_catalogue.SHAPES) with random weights, built in memory: the
benchmarks and `pagoda-runtime serve --load-format dummy` need no checkpoint.

The weights are drawn on the target device one tensor at a time, so an 8B model never sits in
host memory; the same seed gives every tensor-parallel rank the same whole tensors to slice. Token
ids carry no meaning, so the tokenizer is a bare vocabulary of the right size whose token i is the
text `<i>`: token ids decode to such words and those words, split on whitespace, encode back to
the same ids; any other word is token 0. There is no chat template and no end-of-sequence token,
so a generation runs to max_tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.model_catalogue import shape_config
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.executor.models import weight_shapes
from pagoda_runtime.loading.model_source import LoadedModel


def random_weights(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    shapes: Callable[[ModelConfig], dict[str, tuple[int, ...]]] = weight_shapes,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`shapes`: the tensors drawn, of `config` (the model's, or its MTP layer's)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, shape in shapes(config).items():
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, device=device, dtype=dtype)
        else:
            # Small enough that activations stay finite through every layer.
            yield name, (torch.randn(shape, device=device, generator=generator) * 0.02).to(dtype)


def bare_tokenizer(vocab_size: int, source: str = "random") -> Tokenizer:
    vocab = {f"<{i}>": i for i in range(vocab_size)}
    backend = BackendTokenizer(WordLevel(vocab, unk_token="<0>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return Tokenizer(
        backend, source=source, bos_token=None, eos_token=None, eos_token_ids=(), chat_template=None
    )


def random_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """Raises ValueError naming the shapes there are when `name` is not one."""
    config = shape_config(name)
    return LoadedModel(
        config,
        random_weights(config, device, dtype, seed),
        bare_tokenizer(config.architecture.vocab_size, f"{name} (random weights)"),
    )
