"""The Mamba-2 layer of hybrid models (Granite 4.0-H, Nemotron-H): a selective state space in place
of attention.

Each token's in_proj gives a gate z, the channels of a causal convolution (x, then B and C of each
group of heads) and one time step per head. After the convolution and SiLU, each head h keeps a
head_dim x state_size state H that every token t updates and reads:

    H = exp(dt_t * A_h) * H + dt_t * x_t B_t^T        y_t = H C_t + D_h * x_t

with dt_t = softplus(dt_t + dt_bias_h); y then goes through an RMSNorm gated by SiLU(z) and out_proj.

A sequence's whole past is its state: the convolution's last kernel - 1 inputs and H per head, one
slot per running sequence (recurrent_state.py) in place of KV blocks. A step's first token of a
sequence (AttentionMetadata.state_fresh) starts from zeros; a prompt chunked over steps carries its
slot from one chunk to the next. A prompt chunk runs the state space in its chunked (SSD) form,
SCAN_CHUNK tokens at a time: within a chunk as a masked product, between chunks through the state;
a decode step runs the recurrence for every sequence at once. Computed in float32; the state is
held in the KV cache's dtype (the model's, as vLLM's default holds it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.models.layers import down_projection
from pagoda_runtime.executor.models.recurrent_state import (
    RecurrentState,
    convolve_chunk,
    convolve_step,
    depthwise_conv,
    each_sequence,
    per_head,
    recurrent_chunk,
    recurrent_step,
)
from pagoda_runtime.executor.quantization import make_linear
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel

# Tokens of a prompt chunk the state space takes at once: its within-chunk product is Q x Q per head.
SCAN_CHUNK = 128


class GatedRMSNorm(nn.Module):
    """RMSNorm of y * SiLU(z) over each group of `group_size` channels (the whole width where the
    model has one group), in float32."""

    def __init__(self, size: int, group_size: int, eps: float, device, dtype) -> None:
        super().__init__()
        self.eps, self.group_size = eps, group_size
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        gated = y.float() * F.silu(z.float())
        groups = gated.view(*gated.shape[:-1], -1, self.group_size)
        normed = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.view_as(gated).to(self.weight.dtype)


class Mamba2Mixer(nn.Module):
    """The layer's token mixer, called as attention is: (positions, x, state, meta, cos_sin_cache)."""

    def __init__(
        self,
        config: ModelConfig,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel = SINGLE_PROCESS,
        *,
        norm_groups: int = 1,
    ) -> None:
        """norm_groups: the groups of heads the gated norm normalizes apart, over the whole layer."""
        super().__init__()
        whole = config.architecture
        # Split over tensor-parallel ranks by heads and their groups: in_proj column-parallel,
        # out_proj row-parallel with a sum over the ranks after it.
        arch = whole.per_rank(tp.size)
        self.tp = tp
        self.heads, self.head_dim = arch.mamba_num_heads, arch.mamba_head_dim
        self.groups, self.state_size = arch.mamba_groups, arch.mamba_state_size
        self.inner, self.conv_dim = arch.mamba_intermediate_size, arch.mamba_conv_dim
        self.kernel = arch.mamba_conv_kernel
        self.in_proj = make_linear(
            arch.hidden_size, self.inner + self.conv_dim + self.heads, False, quantization, device, dtype
        )
        self.conv1d = depthwise_conv(self.conv_dim, self.kernel, True, device, dtype)
        self.dt_bias, self.A_log, self.D = (per_head(self.heads, device, dtype) for _ in range(3))
        group_size = whole.mamba_intermediate_size // norm_groups
        self.norm = GatedRMSNorm(self.inner, group_size, config.rms_norm_eps, device, dtype)
        self.out_proj = down_projection(
            arch.hidden_size, whole.mamba_intermediate_size, quantization, device, dtype, tp, "Mamba-2 heads"
        )

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        state: RecurrentState,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.heads], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        if meta.max_query_len == 1:
            y = self._decode(xbc, dt, state, meta)
        else:
            y = each_sequence(
                meta,
                torch.empty(x.shape[0], self.inner, device=x.device),
                lambda rows, slot, fresh: self._prefill(xbc[rows], dt[rows], state, slot, fresh),
            )
        return self.tp.all_reduce(self.out_proj(self.norm(y, z).to(x.dtype)))

    @property
    def _A(self) -> torch.Tensor:
        return -torch.exp(self.A_log.float())

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, heads, head_dim], and B and C [T, heads, state_size] (each group's, for its heads)."""
        n = self.groups * self.state_size
        x, B, C = xbc.split([self.inner, n, n], dim=-1)
        per_group = self.heads // self.groups
        B = B.reshape(-1, self.groups, self.state_size).repeat_interleave(per_group, dim=1)
        C = C.reshape(-1, self.groups, self.state_size).repeat_interleave(per_group, dim=1)
        return x.reshape(-1, self.heads, self.head_dim), B, C

    def _prefill(
        self, xbc: torch.Tensor, dt: torch.Tensor, state: RecurrentState, slot: int, fresh: bool
    ) -> torch.Tensor:
        """One sequence's chunk of L tokens from its slot's state (zeros when fresh): y [L, inner]."""
        x, B, C = self._split(convolve_chunk(state, slot, fresh, xbc, self.conv1d))
        y, h = chunked_scan(x, dt, self._A, B, C, recurrent_chunk(state, slot, fresh))
        state.recurrent[slot] = h.to(state.recurrent.dtype)
        return (y + self.D.float()[:, None] * x).reshape(-1, self.inner)

    def _decode(
        self, xbc: torch.Tensor, dt: torch.Tensor, state: RecurrentState, meta: AttentionMetadata
    ) -> torch.Tensor:
        """One token of each sequence (row i: sequence i): the recurrence for all at once."""
        x, B, C = self._split(convolve_step(state, meta, xbc, self.conv1d))
        decay = torch.exp(dt * self._A)  # [S, heads]
        h = recurrent_step(state, meta) * decay[:, :, None, None]
        h = h + (dt[:, :, None] * x)[..., None] * B[:, :, None, :]
        state.recurrent.index_copy_(0, meta.state_slots, h.to(state.recurrent.dtype))
        y = (h @ C[..., None]).squeeze(-1) + self.D.float()[:, None] * x
        return y.reshape(-1, self.inner)


def chunked_scan(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The state space over L tokens from state h [heads, head_dim, state], SCAN_CHUNK at a time,
    in float32: x [L, heads, head_dim], dt [L, heads], A [heads], B and C [L, heads, state].
    Returns y [L, heads, head_dim] (without the D skip) and the state after the last token."""
    ys = []
    for first in range(0, x.shape[0], SCAN_CHUNK):
        part = slice(first, first + SCAN_CHUNK)
        xq, dtq, Bq, Cq = x[part].float(), dt[part], B[part].float(), C[part].float()
        # Log decay from the chunk's start to each token, per head: [Q, heads].
        decay = torch.cumsum(dtq * A, dim=0)
        q = xq.shape[0]
        causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
        between = (decay[:, None, :] - decay[None, :, :]).masked_fill(~causal[..., None], float("-inf"))
        weights = torch.einsum("thn,shn->tsh", Cq, Bq) * torch.exp(between) * dtq[None]
        y = torch.einsum("tsh,shp->thp", weights, xq)
        y += torch.einsum("thn,hpn->thp", Cq, h) * torch.exp(decay)[..., None]
        to_end = torch.exp(decay[-1][None] - decay) * dtq  # [Q, heads]
        h = h * torch.exp(decay[-1])[:, None, None] + torch.einsum("sh,shp,shn->hpn", to_end, xq, Bq)
        ys.append(y)
    return torch.cat(ys), h


def rank_rows(config: ModelConfig, tp: TensorParallel, leaf: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a Mamba-2 layer's checkpoint tensor `leaf` (in_proj's z, x, B, C and dt;
    the convolution's x, B and C channels; the per-head and per-channel parameters): those of its
    heads and their groups. out_proj's columns are cut by its own load."""
    arch = config.architecture
    inner, heads = arch.mamba_intermediate_size, arch.mamba_num_heads
    groups = arch.mamba_groups * arch.mamba_state_size
    layout = {
        "in_proj.weight": (inner, inner, groups, groups, heads),
        "conv1d.weight": (inner, groups, groups),
        "conv1d.bias": (inner, groups, groups),
        "dt_bias": (heads,),
        "A_log": (heads,),
        "D": (heads,),
        "norm.weight": (inner,),
    }.get(leaf)
    return tensor if layout is None else tp.rows_of_parts(tensor, layout, "Mamba-2 heads")
