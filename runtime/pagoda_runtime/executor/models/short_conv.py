"""LFM2's gated short convolution, the token mixer of its conv layers: in_proj gives B, C and x per
channel, and the output is out_proj(C * conv(B * x)), conv a depthwise causal convolution of
short_conv_kernel taps (no activation). A sequence's past is the convolution's last kernel - 1
inputs, kept in a slot of recurrent_state.py as a Mamba layer keeps its state."""

from __future__ import annotations

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.models.recurrent_state import (
    RecurrentState,
    convolve_chunk,
    convolve_step,
    depthwise_conv,
    each_sequence,
)
from pagoda_runtime.executor.quantization import make_linear


class ShortConv(nn.Module):
    """Called as attention is: (positions, x, state, meta, cos_sin_cache)."""

    def __init__(
        self, config: ModelConfig, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        arch = config.architecture
        hidden = self.hidden = arch.hidden_size
        self.in_proj = make_linear(hidden, 3 * hidden, False, quantization, device, dtype)
        self.conv = depthwise_conv(hidden, arch.short_conv_kernel, False, device, dtype)
        self.out_proj = make_linear(hidden, hidden, False, quantization, device, dtype)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        state: RecurrentState,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        b, c, h = self.in_proj(x).float().chunk(3, dim=-1)
        gated = b * h
        if meta.max_query_len == 1:
            mixed = convolve_step(state, meta, gated, self.conv, silu=False)
        else:
            mixed = each_sequence(
                meta,
                torch.empty_like(gated),
                lambda rows, slot, fresh: convolve_chunk(
                    state, slot, fresh, gated[rows], self.conv, silu=False
                ),
            )
        return self.out_proj((c * mixed).to(x.dtype))
