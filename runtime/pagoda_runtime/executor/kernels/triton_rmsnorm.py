"""RMSNorm with the residual add fused in: one read of x and residual, one write of each result.

The sum is rounded to x's dtype before it is normalized, as transformers adds in the model dtype,
and the normalized value is rounded to x's dtype before the weight multiplies it, as transformers
does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_r,
    eps,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x + tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)).to(x.dtype)
        tl.store(residual_out_ptr + row * N + cols, x, mask=mask)
    hidden = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hidden * hidden, axis=0) / N + eps)
    normed = (hidden * rstd).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * N + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual) for x [T, N]; without a residual, (…, x)."""
    num_rows, n = x.shape
    assert x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
    out = torch.empty(num_rows, n, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    summed = x if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if num_rows:
        _rms_norm_kernel[(num_rows,)](
            x,
            x if residual is None else residual,
            weight,
            out,
            summed,
            x.stride(0),
            x.stride(0) if residual is None else residual.stride(0),
            eps,
            N=n,
            BLOCK_N=triton.next_power_of_2(n),
            HAS_RESIDUAL=residual is not None,
            num_warps=min(16, max(1, triton.next_power_of_2(n) // 256)),
        )
    return out, summed
