"""The expert activations other than SiLU(gate) * up. A mixture-of-experts call names one by value,
and the Triton kernel takes its constants as runtime arguments, so a model's own constants compile
no new kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClampedSwiGLU:
    """GPT-OSS's expert activation (transformers' GptOssExperts): gate clamped above at `limit`, up
    clamped to [-limit, limit], then gate * sigmoid(alpha * gate) * (up + 1); limit is the config's
    swiglu_limit."""

    alpha: float = 1.702
    limit: float = 7.0


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, act: ClampedSwiGLU) -> torch.Tensor:
    """In the inputs' dtype, operation by operation, as transformers rounds it."""
    gate = gate.clamp(max=act.limit)
    up = up.clamp(min=-act.limit, max=act.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * act.alpha))
