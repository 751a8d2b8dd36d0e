"""Bytes the weights of a built model really occupy, to report beside sizing.py's estimate, and
what one decode step reads of them (the batch-1 roofline's numerator)."""

from __future__ import annotations

from torch import nn

from pagoda_runtime.contract.sizing import decode_read_bytes
from pagoda_runtime.executor.quantization.linear import DenseLinear, QuantizedLinear
from pagoda_runtime.executor.vocab_parallel import VocabParallel


def linear_weight_bytes(model: nn.Module) -> int:
    """Stored bytes of every projection built by make_linear (packed weights, scales, offsets)."""
    total = 0
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            packed = module.cpu_weight if module.cpu_weight is not None else module.gpu_weight
            if packed is not None:
                total += sum(t.numel() * t.element_size() for t in packed.buffers())
            elif module.qweight is not None:
                total += module.weight.nbytes
        elif isinstance(module, DenseLinear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def model_weight_bytes(model: nn.Module) -> int:
    """Stored bytes of everything a checkpoint fills: parameters and packed buffers, but not derived
    buffers such as the rotary cos/sin table, which are not saved with the model. A layer packed for
    its kernels (CPU or GPU) holds only its packed buffers, so no weight is counted twice; an LM head
    packed for fbgemm (vocab_parallel.py) is counted beside its lookup table."""
    stored = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    return stored + sum(m.head_bytes for m in model.modules() if isinstance(m, VocabParallel))


def decode_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step of `model` (a CausalLM) reads, as stored: the rule is
    sizing.decode_read_bytes, which sizing.decode_weight_bytes applies to the estimate; a token
    reads only the experts it is routed to (idle_expert_bytes of a mixture-of-experts layer)."""
    embedding = model.embed_tokens
    # Tied: the LM head reads the lookup table itself, unless it keeps a packed copy of its own.
    tied = model.lm_head is None and not embedding.head_bytes
    idle = sum(m.idle_expert_bytes() for m in model.modules() if hasattr(m, "idle_expert_bytes"))
    # A draft head borrowing the target's embedding holds none to leave out.
    held = any(module is embedding for module in model.modules())
    return decode_read_bytes(model_weight_bytes(model) - idle, embedding.weight.nbytes if held else 0, tied)
