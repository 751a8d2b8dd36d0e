"""Batched LoRA: one step mixes the tokens of many adapters and of the base model, and every
projection adds each token's own adapter delta after its base matmul (punica's SGMV design):

    base_out[t, part i] += scaling[s] * (x[t] @ A_i[s]^T) @ B_i[s]^T,  s = the token's slot

`lora_slots.lora_batch` groups the step's tokens by slot once, for every layer; `add_lora` is what
the model calls after a projection, on the best path for the device: the Triton shrink and expand
kernels on CUDA (triton_lora.py), the PyTorch reference elsewhere (lora_reference.py). The weights
are laid out as lora_weights.py describes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# First, so that the Triton kernel module is decorated compiled or interpreted as it decides.
from pagoda_runtime.executor import triton_mode  # noqa: F401
from pagoda_runtime.executor.kernels.lora_reference import reference_add_lora
from pagoda_runtime.executor.kernels.lora_slots import LoraBatch


def add_lora(
    base_out: torch.Tensor,
    x: torch.Tensor,
    batch: LoraBatch,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: torch.Tensor,
    output_slices: Sequence[int],
) -> torch.Tensor:
    """base_out [T, sum(output_slices)] += each token's adapter delta from x [T, H], in place."""
    num_slices, num_slots, _, in_features = lora_a.shape
    if num_slices != len(output_slices) or lora_b.shape[:2] != (num_slots, sum(output_slices)):
        raise ValueError(
            f"LoRA weights A {tuple(lora_a.shape)} and B {tuple(lora_b.shape)} do not fit output parts "
            f"{tuple(output_slices)}; build them with lora_weights.stack_lora_weights"
        )
    if x.shape[1] != in_features or base_out.shape[1] != sum(output_slices):
        raise ValueError(
            f"a projection of {x.shape[1]} inputs and {base_out.shape[1]} outputs cannot take LoRA weights "
            f"of {in_features} inputs and {sum(output_slices)} outputs"
        )
    if base_out.is_cuda:
        from pagoda_runtime.executor.kernels.triton_lora import add_lora as triton_add_lora

        return triton_add_lora(base_out, x, batch, lora_a, lora_b, scaling, output_slices)
    return reference_add_lora(base_out, x, batch.token_slots, lora_a, lora_b, scaling, output_slices)
