"""The state a hybrid model's Mamba-2 or gated DeltaNet layer keeps per sequence, in place of KV
blocks: one slot per running sequence (engine/state_block_manager.py hands them out), each the
causal convolution's last kernel - 1 inputs and the layer's recurrent state per head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda_runtime.contract.sizing import ModelArchitecture


@dataclass
class RecurrentState:
    """One layer's states, slot by slot: conv [slots, channels, kernel - 1] and recurrent [slots,
    heads, ...]: a Mamba-2 head's head_dim x state_size, a DeltaNet value head's key x value."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv, self.recurrent))


def allocate_state(
    arch: ModelArchitecture, layer: int, slots: int, device: torch.device, dtype: torch.dtype
) -> RecurrentState:
    """Layer `layer`'s states (ModelArchitecture.state_numel per slot), zeroed."""
    if arch.layer_types[layer] == "mamba":
        conv = (arch.mamba_conv_dim, arch.mamba_conv_kernel - 1)
        recurrent = (arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_state_size)
    else:
        conv = (arch.linear_conv_dim, arch.linear_conv_kernel - 1)
        recurrent = (arch.linear_num_value_heads, arch.linear_key_head_dim, arch.linear_value_head_dim)
    return RecurrentState(
        torch.zeros(slots, *conv, device=device, dtype=dtype),
        torch.zeros(slots, *recurrent, device=device, dtype=dtype),
    )
