"""A sequence classifier's head (contract/pooling.Classifier) as the pooler applies it: [outputs,
hidden] float32, read from the checkpoint on its own (a few rows, whatever the model's quantization
or tensor-parallel split), as transformers' score layer or vLLM's classifier_from_token builds it."""

from __future__ import annotations

from pathlib import Path

import torch

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.loading.model_source import ModelLoadError, read_float_tensor


def classifier_head(
    config: ModelConfig, folder: Path | None, tokenizer: Tokenizer, seed: int
) -> torch.Tensor:
    """`folder`: the checkpoint's; None for random weights (load_format dummy), which draw it."""
    classifier = config.classifier
    hidden = config.architecture.hidden_size
    if folder is None:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(len(classifier.labels), hidden, generator=generator) * hidden**-0.5
    if not classifier.from_tokens:
        weight = read_float_tensor(folder, "score.weight")
        shape = [len(classifier.labels), hidden]
        if weight is None or list(weight.shape) != shape:
            found = "none" if weight is None else f"shape {list(weight.shape)}"
            raise ModelLoadError(
                f"{folder} is a sequence classifier of {shape[0]} labels, so it needs score.weight of shape "
                f"{shape}, and has {found}; download it again"
            )
        return weight
    ids = []
    for token in classifier.from_tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ModelLoadError(
                f"classifier_from_token {token!r} is {len(encoded)} tokens to this model's tokenizer; "
                "name tokens that are one token each"
            )
        ids.append(encoded[0])
    lm_head = read_float_tensor(folder, "lm_head.weight")
    if lm_head is None:
        lm_head = read_float_tensor(folder, "model.embed_tokens.weight")  # tied to the embedding
    rows = lm_head[ids]
    # [false, true]: sigmoid(true - false) is the true token's two-way softmax.
    return rows if len(ids) == 1 else (rows[1] - rows[0]).unsqueeze(0)
