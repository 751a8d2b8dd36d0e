"""The state a hybrid model's recurrent layer (Mamba-2, gated DeltaNet, short convolution) keeps
per sequence, in place of KV
blocks: one slot per running sequence (engine/state_block_manager.py hands them out), each the
causal convolution's last kernel - 1 inputs and the layer's recurrent state per head."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.executor.attention_metadata import AttentionMetadata


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
    kind = arch.layer_types[layer]
    if kind == "mamba":
        conv = (arch.mamba_conv_dim, arch.mamba_conv_kernel - 1)
        recurrent = (arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_state_size)
    elif kind == "conv":  # a short convolution keeps nothing but its window
        conv, recurrent = (arch.hidden_size, arch.short_conv_kernel - 1), (0,)
    else:
        conv = (arch.linear_conv_dim, arch.linear_conv_kernel - 1)
        recurrent = (arch.linear_num_value_heads, arch.linear_key_head_dim, arch.linear_value_head_dim)
    return RecurrentState(
        torch.zeros(slots, *conv, device=device, dtype=dtype),
        torch.zeros(slots, *recurrent, device=device, dtype=dtype),
    )


def depthwise_conv(channels: int, kernel: int, bias: bool, device, dtype) -> nn.Conv1d:
    """A layer's causal convolution, one filter per channel, left for the checkpoint to fill."""
    conv = nn.utils.skip_init(
        nn.Conv1d, channels, channels, kernel, groups=channels, bias=bias, device=device, dtype=dtype
    )
    return conv.requires_grad_(False)


def per_head(heads: int, device, dtype) -> nn.Parameter:
    """One number per head (a time-step bias, A, D), filled from the checkpoint."""
    return nn.Parameter(torch.zeros(heads, device=device, dtype=dtype), requires_grad=False)


def _host_spans(meta: AttentionMetadata) -> tuple[list[int], list[int], list[bool]]:
    """The step's query starts, state slots and fresh flags on the host, read once a step (a prompt
    chunk's step runs its sequences one by one)."""
    if "state_spans" not in meta.derived:
        meta.derived["state_spans"] = (
            meta.query_start_loc.tolist(),
            meta.state_slots[: meta.num_seqs].tolist(),
            meta.state_fresh[: meta.num_seqs].tolist(),
        )
    return meta.derived["state_spans"]


def each_sequence(
    meta: AttentionMetadata, out: torch.Tensor, chunk: Callable[[slice, int, bool], torch.Tensor]
) -> torch.Tensor:
    """A prompt-chunk step of a recurrent layer, sequence by sequence: `chunk(rows, slot, fresh)`
    gives the output rows of one sequence's new tokens (and updates its slot), written into out."""
    starts, slots, fresh = _host_spans(meta)
    for i, slot in enumerate(slots):
        rows = slice(starts[i], starts[i + 1])
        if rows.start < rows.stop:
            out[rows] = chunk(rows, slot, fresh[i])
    return out


def convolve_chunk(
    state: RecurrentState, slot: int, fresh: bool, x: torch.Tensor, conv: nn.Conv1d, silu: bool = True
) -> torch.Tensor:
    """The depthwise causal convolution (and its SiLU, unless `silu` is false: LFM2's) over one
    sequence's L new inputs x [L, C], after the kernel - 1 its slot holds (zeros when fresh), which
    then become its last kernel - 1: [L, C] in float32."""
    held = torch.zeros_like(state.conv[slot]) if fresh else state.conv[slot]
    window = torch.cat([held, x.T.to(held.dtype)], dim=-1)
    state.conv[slot] = window[:, -held.shape[-1] :]
    out = F.conv1d(window[None].to(conv.weight.dtype), conv.weight, conv.bias, groups=window.shape[0])
    out = out[0].float().T
    return F.silu(out) if silu else out


def convolve_step(
    state: RecurrentState, meta: AttentionMetadata, x: torch.Tensor, conv: nn.Conv1d, silu: bool = True
) -> torch.Tensor:
    """The same for one input of each sequence (row i: sequence i's), all at once: [S, C] in float32."""
    keep = (~meta.state_fresh).to(state.conv.dtype)
    held = state.conv.index_select(0, meta.state_slots) * keep[:, None, None]
    window = torch.cat([held, x[:, :, None].to(held.dtype)], dim=-1)
    state.conv.index_copy_(0, meta.state_slots, window[:, :, 1:])
    mixed = (window.float() * conv.weight[:, 0, :].float()).sum(-1)
    if conv.bias is not None:
        mixed = mixed + conv.bias.float()
    return F.silu(mixed) if silu else mixed


def recurrent_chunk(state: RecurrentState, slot: int, fresh: bool) -> torch.Tensor:
    """One sequence's recurrent state in float32, zeros when fresh."""
    h = state.recurrent[slot].float()
    return torch.zeros_like(h) if fresh else h


def recurrent_step(state: RecurrentState, meta: AttentionMetadata) -> torch.Tensor:
    """Each sequence's recurrent state in float32 (row i: sequence i's), zeros where fresh."""
    h = state.recurrent.index_select(0, meta.state_slots).float()
    keep = (~meta.state_fresh).float()
    return h * keep.view(-1, *([1] * (h.dim() - 1)))
