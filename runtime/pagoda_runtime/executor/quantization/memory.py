"""Bytes the weights of a built model really occupy, to report beside sizing.py's estimate, and
what one decode step reads of them (the batch-1 roofline's numerator)."""

from __future__ import annotations

from torch import nn

from pagoda_runtime.contract.sizing import decode_read_bytes
from pagoda_runtime.executor.quantization.linear import DenseLinear, QuantizedLinear


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
    buffers such as the rotary cos/sin table, which are not saved with the model. A layer packed for
    the CPU kernels holds only its packed buffers, so no weight is counted twice."""
    return sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())


def decode_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step of `model` (a CausalLM) reads, as stored: the rule
    is sizing.decode_read_bytes, which sizing.decode_weight_bytes applies to the estimate; a token
    reads only the experts it is routed to (idle_expert_bytes of a mixture-of-experts layer)."""
    embedding = model.embed_tokens.weight
    tied = model.lm_head is None
    idle = sum(m.idle_expert_bytes() for m in model.modules() if hasattr(m, "idle_expert_bytes"))
    return decode_read_bytes(
        model_weight_bytes(model) - idle, embedding.numel() * embedding.element_size(), tied
    )
