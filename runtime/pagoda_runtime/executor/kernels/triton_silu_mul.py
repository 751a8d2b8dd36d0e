"""SiLU(gate) * up straight from the fused gate_up projection, so the two halves are read once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, stride_in, N: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + N + cols, mask=mask, other=0.0)
    # Round SiLU(gate) to the model dtype before the product, as transformers does.
    silu = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + row * N + cols, silu * up, mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [T, 2 * I] holding gate in the first half -> [T, I]."""
    num_rows, two_n = gate_up.shape
    assert gate_up.stride(-1) == 1
    n = two_n // 2
    out = torch.empty(num_rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block_n = min(1024, triton.next_power_of_2(n))
    if num_rows:
        _silu_and_mul_kernel[(num_rows, triton.cdiv(n, block_n))](
            gate_up, out, gate_up.stride(0), N=n, BLOCK_N=block_n
        )
    return out
