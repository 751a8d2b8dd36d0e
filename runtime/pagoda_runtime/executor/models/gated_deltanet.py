"""The gated DeltaNet layer (linear attention) of Qwen3.5 and Qwen3-Next: a recurrent state per value
head in place of attention's keys and values.

in_proj gives q and k (linear_num_key_heads heads), v and a gate z (linear_num_value_heads), and
per value head b and a. After a causal convolution and SiLU over q, k and v, q and k are
L2-normalized (q also scaled by 1/sqrt(key_head_dim)) and shared by the value heads of their group;
each value head h keeps a key_head_dim x value_head_dim state S that every token updates by the
gated delta rule and reads:

    S = exp(g_t) S        S = S + k_t (beta_t (v_t - S^T k_t))^T        o_t = S^T q_t

with beta_t = sigmoid(b_t) and g_t = -exp(A_log_h) softplus(a_t + dt_bias_h). o goes through an
RMSNorm per head, times SiLU(z), and out_proj. A prompt chunk runs the rule in its chunked form
(`chunked_delta_rule`), a decode step the recurrence for every sequence at once; the state lives in
recurrent_state.py's slots, as a Mamba-2 layer's does. Computed in float32.
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

# Tokens of a prompt chunk the rule takes at once: a Q x Q triangular system per head.
RULE_CHUNK = 64


class GatedHeadNorm(nn.Module):
    """RMSNorm of each head's output, then times SiLU(z), in float32."""

    def __init__(self, size: int, eps: float, device, dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.float() * normed * F.silu(z.float())


class GatedDeltaNet(nn.Module):
    """The layer's token mixer, called as attention is: (positions, x, state, meta, cos_sin_cache).
    in_proj holds the checkpoint's in_proj_qkv, in_proj_z, in_proj_b and in_proj_a, in that order."""

    def __init__(
        self,
        config: ModelConfig,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel = SINGLE_PROCESS,
    ) -> None:
        super().__init__()
        whole = config.architecture
        # Split over tensor-parallel ranks by key heads, each with the value heads that share it:
        # in_proj column-parallel, out_proj row-parallel with a sum over the ranks after it.
        arch = whole.per_rank(tp.size)
        self.tp = tp
        self.k_heads, self.v_heads = arch.linear_num_key_heads, arch.linear_num_value_heads
        self.k_dim, self.v_dim = arch.linear_key_head_dim, arch.linear_value_head_dim
        self.conv_dim, self.value_size = arch.linear_conv_dim, arch.linear_value_dim
        self.in_proj = make_linear(
            arch.hidden_size,
            self.conv_dim + self.value_size + 2 * self.v_heads,
            False,
            quantization,
            device,
            dtype,
        )
        self.conv1d = depthwise_conv(self.conv_dim, arch.linear_conv_kernel, False, device, dtype)
        self.dt_bias, self.A_log = (per_head(self.v_heads, device, dtype) for _ in range(2))
        self.norm = GatedHeadNorm(self.v_dim, config.rms_norm_eps, device, dtype)
        self.out_proj = down_projection(
            arch.hidden_size, whole.linear_value_dim, quantization, device, dtype, tp, "gated DeltaNet heads"
        )

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        state: RecurrentState,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        qkv, z, b, a = self.in_proj(x).split(
            [self.conv_dim, self.value_size, self.v_heads, self.v_heads], dim=-1
        )
        beta = torch.sigmoid(b.float())
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.dt_bias.float())
        if meta.max_query_len == 1:
            q, k, v = self._split(convolve_step(state, meta, qkv, self.conv1d))
            o = self._step(q, k, v, g, beta, state, meta)
        else:

            def chunk(rows: slice, slot: int, fresh: bool) -> torch.Tensor:
                q, k, v = self._split(convolve_chunk(state, slot, fresh, qkv[rows], self.conv1d))
                h = recurrent_chunk(state, slot, fresh)
                o, h = chunked_delta_rule(q, k, v, g[rows], beta[rows], h)
                state.recurrent[slot] = h.to(state.recurrent.dtype)
                return o

            o = each_sequence(meta, torch.empty(x.shape[0], self.v_heads, self.v_dim, device=x.device), chunk)
        gated = self.norm(o, z.view_as(o))
        return self.tp.all_reduce(self.out_proj(gated.reshape(-1, self.value_size).to(x.dtype)))

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k [T, value heads, key_head_dim] (normalized, each key head's shared by its value
        heads; q scaled) and v [T, value heads, value_head_dim], from the convolution's output."""
        key_size = self.k_heads * self.k_dim
        q, k, v = qkv.split([key_size, key_size, self.value_size], dim=-1)
        per_key = self.v_heads // self.k_heads
        q, k = (
            _l2_normalized(t.reshape(-1, self.k_heads, self.k_dim)).repeat_interleave(per_key, dim=1)
            for t in (q, k)
        )
        return q * self.k_dim**-0.5, k, v.reshape(-1, self.v_heads, self.v_dim)

    @staticmethod
    def _step(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: RecurrentState,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """One token of each sequence (row i: sequence i): the rule for all at once, [S, heads, dv]."""
        h = recurrent_step(state, meta) * torch.exp(g)[..., None, None]
        remembered = (h * k[..., None]).sum(-2)
        h = h + k[..., None] * ((v - remembered) * beta[..., None])[..., None, :]
        state.recurrent.index_copy_(0, meta.state_slots, h.to(state.recurrent.dtype))
        return (h * q[..., None]).sum(-2)


def _l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def chunked_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over L tokens from state h [heads, dk, dv], RULE_CHUNK at a time, in
    the inputs' dtype (float32 here): q and k [L, heads, dk], v [L, heads, dv], g and beta
    [L, heads]. Returns o [L, heads, dv] and the state after the last token.

    Within a chunk the corrections the rule writes, v'_i = beta_i (v_i - S_{i-1}^T k_i), solve a unit
    lower-triangular system, (I + A) V' = beta V - (beta exp(G) K) S, where A_ij = beta_i exp(G_i - G_j)
    k_i . k_j for j < i and G is the decay accumulated from the chunk's start; then
    o_i = exp(G_i) S^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) v'_j, and the state moves to
    exp(G_last) S + sum_j exp(G_last - G_j) k_j v'_j^T."""
    outs = []
    for first in range(0, q.shape[0], RULE_CHUNK):
        part = slice(first, first + RULE_CHUNK)
        qc, kc, vc = (t[part].transpose(0, 1) for t in (q, k, v))  # [heads, Q, d]
        bc = beta[part].T[..., None]  # [heads, Q, 1]
        decay = torch.cumsum(g[part].T, dim=-1)  # [heads, Q]
        n = decay.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        between = torch.exp((decay[..., :, None] - decay[..., None, :]).masked_fill(~causal, float("-inf")))
        system = (bc * kc) @ kc.transpose(-1, -2) * between
        rhs = torch.cat([bc * vc, bc * torch.exp(decay)[..., None] * kc], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        corrections = solved[..., : vc.shape[-1]] - solved[..., vc.shape[-1] :] @ h
        o = (qc * torch.exp(decay)[..., None]) @ h + ((qc @ kc.transpose(-1, -2)) * between) @ corrections
        to_end = torch.exp(decay[..., -1:] - decay)[..., None]  # [heads, Q, 1]
        h = h * torch.exp(decay[..., -1])[:, None, None] + (kc * to_end).transpose(-1, -2) @ corrections
        outs.append(o.transpose(0, 1))
    return torch.cat(outs), h
