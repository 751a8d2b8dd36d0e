from __future__ import annotations

import numpy as np
import pytest
from pagoda_runtime.executor import triton_mode


@pytest.fixture
def bf16_as_on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes Triton's interpreter compute bf16 kernels as the GPU does, where it computes them
    otherwise (bf16 is unsupported there, triton-lang/triton#11584): it keeps bf16 as raw uint16
    bits, so its tl.dot multiplies the bits (here the operands are widened to float32 first, which
    is what the tensor cores compute with them: exact products, float32 sums), and it rounds float32
    to bf16 toward zero (here to nearest even, as cvt.rn.bf16.f32 does). The kernels do every other
    bf16 operation in float32. Nothing to do on a GPU."""
    if not triton_mode.INTERPRETED:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    create_dot, cast_impl = (
        interpreter.InterpreterBuilder.create_dot,
        interpreter.InterpreterBuilder.cast_impl,
    )

    def widen(operand):
        if operand.dtype.scalar != tl.bfloat16:
            return operand
        bits = operand.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    def cast(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast_impl(self, src, dst_type)
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
        nearest_even = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return interpreter.TensorHandle(nearest_even.astype(np.uint16), tl.bfloat16)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", dot)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", cast)
