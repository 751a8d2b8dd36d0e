"""Where the engine runs and in what precision: --device and --dtype, resolved once at build time.

The result is handed to everything that needs it (model runner, benchmarks' baseline), so that
"auto" is decided in one place and the parts cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed

# What an error says when the device or the tensor-parallel group is broken rather than one step's inputs.
_BROKEN = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "NCCL", "gloo", "device-side assert")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_NUMPY = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype  # of the unquantized weights and the activations

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)


def host_list_on(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A list of host numbers as a tensor on `device`, without waiting for the device's queued work.

    numpy reads a list about three times faster than torch.tensor does (a 256-sequence step builds
    thousands of block-table entries); on CUDA the copy goes from pinned memory, non-blocking,
    since a plain copy from pageable memory waits for everything queued on the stream first.
    """
    array = torch.from_numpy(np.array(values, dtype=_NUMPY[dtype]))
    if device.type != "cuda":
        return array
    return array.pin_memory().to(device, non_blocking=True)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name} asks for a GPU, but torch sees none; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use auto, float32, float16 or bfloat16")
    return _DTYPES[name]


def resolve_placement(device: str, dtype: str) -> Placement:
    resolved = resolve_device(device)
    return Placement(resolved, resolve_dtype(dtype, resolved))


def dtype_name(dtype: torch.dtype) -> str:
    """The --dtype name of a torch dtype ("float32", "bfloat16", "float16")."""
    return str(dtype).removeprefix("torch.")


def is_device_failure(error: BaseException) -> bool:
    """Whether an error from a step means the device or the tensor-parallel group is broken (a CUDA
    error, a failed collective, a lost rank), so that no later step can succeed either. Anything
    else, an out-of-memory error included, came from what that one step ran."""
    if isinstance(error, torch.AcceleratorError | torch.distributed.DistError):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error) for sign in _BROKEN)
