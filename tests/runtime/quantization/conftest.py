"""Without a GPU the Triton kernels run in the interpreter, switched on before triton is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
