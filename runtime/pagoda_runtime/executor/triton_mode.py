"""How the Triton kernels run: compiled for the GPU, or in Triton's interpreter where there is none.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function: its own library functions
(tl.cdiv, the reductions) when triton is first imported, each kernel when its module is imported.
All of them must agree, so the choice is made here, once, before triton is imported: compiled
wherever torch sees a CUDA GPU (a TRITON_INTERPRET=1 inherited from the environment is overruled,
so that a GPU run never tests the interpreter), interpreted elsewhere, which lets the kernels'
tests run on CPU tensors. The kernel packages (`kernels`, `quantization`) import this module
before any kernel module, and the test suite's conftest imports it before anything else can
import triton (transformers does).
"""

from __future__ import annotations

import logging
import os
import sys

import torch

logger = logging.getLogger(__name__)

INTERPRETED = not torch.cuda.is_available()


def _imported_interpreted() -> bool | None:
    """Whether an already imported triton decorated its library for the interpreter; None if not imported."""
    if "triton" not in sys.modules:
        return None
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.cdiv, InterpretedFunction)


if not INTERPRETED:
    if _imported_interpreted():
        raise RuntimeError(
            "triton was imported with TRITON_INTERPRET=1 on a machine with a CUDA GPU, so its kernels "
            "would run in the interpreter; unset TRITON_INTERPRET"
        )
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        logger.warning("TRITON_INTERPRET is overruled: a CUDA GPU is visible, so the Triton kernels compile")
# Set for the processes this one starts, too.
os.environ["TRITON_INTERPRET"] = "1" if INTERPRETED else "0"


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for operands of `dtype`: float32 multiplies in full precision
    ("ieee"), where Triton's default would round the operands to TF32 (about 5e-4 relative error);
    16-bit operands are exact on the tensor cores whatever this says."""
    return "ieee" if dtype == torch.float32 else "tf32"
