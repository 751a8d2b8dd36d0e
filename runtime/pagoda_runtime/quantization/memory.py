"""Bytes the weights of a built model really occupy, to report beside sizing.py's estimate."""

from __future__ import annotations

from torch import nn

from .linear import DenseLinear, QuantizedLinear


def linear_weight_bytes(model: nn.Module) -> int:
    """Stored bytes of every projection built by make_linear (packed weights, scales, offsets)."""
    total = 0
    for module in model.modules():
        if isinstance(module, QuantizedLinear) and module.cpu_weight is not None:
            total += sum(t.numel() * t.element_size() for t in module.cpu_weight.buffers())
        elif isinstance(module, QuantizedLinear) and module.qweight is not None:
            total += module.weight.nbytes
        elif isinstance(module, DenseLinear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def model_weight_bytes(model: nn.Module) -> int:
    """Stored bytes of everything a checkpoint fills: parameters and packed buffers, but not derived
    buffers such as the rotary cos/sin table, which are not saved with the model."""
    return sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
