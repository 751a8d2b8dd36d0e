"""The Triton LoRA shrink and expand kernels compute what the PyTorch reference computes on mixed
steps (three adapters and base-model tokens, prefill runs and decode tokens, fused projections'
parts): compiled on a GPU, in Triton's interpreter on a CPU-only machine."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.kernels import triton_lora
from pagoda_runtime.executor.kernels.lora import NO_ADAPTER, lora_batch
from pagoda_runtime.executor.kernels.lora_reference import reference_add_lora, reference_shrink

from .lora_batch_data import make_lora_case, peft_output
from .paged_batch import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32: the same float32 sums in another order; bf16: on top of that, where the order moves a value
# across a rounding boundary of the shrink result or the output, one bf16 ulp there.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-3}


def _reference(case):
    return reference_add_lora(
        case.base_out.clone(),
        case.x,
        case.token_slots,
        case.lora_a,
        case.lora_b,
        case.scaling,
        case.output_slices,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16, 64])
def test_mixed_step_on_a_fused_qkv(dtype, rank, bf16_as_on_gpu) -> None:
    # H = 80 ends inside a K tile; parts of 48, 16 and 16 columns end inside column tiles.
    case = make_lora_case(80, (48, 16, 16), rank, dtype=dtype, device=DEVICE, seed=rank)
    batch = lora_batch(case.token_slots, 4)
    out = case.base_out.clone()
    triton_lora.add_lora(out, case.x, batch, case.lora_a, case.lora_b, case.scaling, case.output_slices)
    assert out.dtype == dtype
    assert relative_error(out, _reference(case)) < TOLERANCE[dtype]
    assert relative_error(out, peft_output(case)) < (1e-5 if dtype == torch.float32 else 1e-2)
    base = case.token_slots == NO_ADAPTER
    assert torch.equal(out[base], case.base_out[base])


@pytest.mark.parametrize("split_k", [1, 3])
def test_split_k_partials_sum_to_the_shrink(split_k: int) -> None:
    case = make_lora_case(200, (24, 24), 16, device=DEVICE, seed=split_k)
    batch = lora_batch(case.token_slots, 4)
    y = triton_lora.lora_shrink(case.x, case.lora_a, batch, case.scaling, split_k=split_k, block_k=32)
    assert y.shape == (split_k, 2, len(case.token_slots), 16)
    ref = reference_shrink(case.x, case.lora_a, case.token_slots, case.scaling)[0]
    active = case.token_slots >= 0
    assert relative_error(y.sum(dim=0)[:, active], ref[:, active]) < 1e-5
    out = triton_lora.lora_expand(
        y, case.lora_b, batch, case.base_out.clone(), case.output_slices, block_n=16
    )
    assert relative_error(out, _reference(case)) < 1e-5


def test_a_decode_batch_on_one_projection(bf16_as_on_gpu) -> None:
    """32 decode tokens of 4 adapters and the base model, one output part (o_proj)."""
    slots = [i % 5 - 1 for i in range(32)]
    case = make_lora_case(64, (96,), 16, dtype=torch.bfloat16, slots=slots, device=DEVICE, seed=7)
    batch = lora_batch(case.token_slots, 4)
    out = triton_lora.add_lora(
        case.base_out.clone(), case.x, batch, case.lora_a, case.lora_b, case.scaling, case.output_slices
    )
    assert relative_error(out, _reference(case)) < TOLERANCE[torch.bfloat16]


def test_a_step_without_adapters_changes_nothing() -> None:
    case = make_lora_case(32, (16,), 8, slots=[NO_ADAPTER] * 5, device=DEVICE)
    out = case.base_out.clone()
    triton_lora.add_lora(
        out, case.x, lora_batch(case.token_slots, 4), case.lora_a, case.lora_b, case.scaling, (16,)
    )
    assert torch.equal(out, case.base_out)
