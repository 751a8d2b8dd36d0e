"""Batched LoRA's step grouping, stacked weights, tensor-parallel shards and CPU reference: every
token gets its own adapter's delta (PEFT's scaling * B(A x)), the base model's tokens none."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.kernels.lora import add_lora
from pagoda_runtime.executor.kernels.lora_slots import NO_ADAPTER, lora_batch
from pagoda_runtime.executor.kernels.lora_weights import shard_lora, stack_lora_weights
from pagoda_runtime.executor.quantization.online import quantize_int8
from pagoda_runtime.executor.quantization.reference import reference_matmul

from .lora_batch_data import MIXED_SLOTS, make_lora_case, peft_output
from .paged_batch import relative_error


def test_lora_batch_groups_tokens_by_slot_in_token_order() -> None:
    slots = torch.tensor([2, -1, 0, 2, 0, -1, 2], dtype=torch.int32)
    batch = lora_batch(slots, num_slots=4)
    assert batch.slot_counts.tolist() == [2, 0, 3, 0]
    assert batch.slot_starts.tolist() == [0, 2, 2, 5]
    assert batch.sorted_tokens.tolist() == [2, 4, 0, 3, 6, 1, 5]  # the base model's tokens last
    assert batch.num_tokens == 7 and batch.num_slots == 4


@pytest.mark.parametrize("rank", [8, 16, 64])
@pytest.mark.parametrize("output_slices", [(48, 16, 16), (40,), (24, 24)])
def test_reference_gives_each_token_its_adapter(rank: int, output_slices: tuple[int, ...]) -> None:
    case = make_lora_case(80, output_slices, rank, seed=rank)
    out = add_lora(
        case.base_out.clone(),
        case.x,
        lora_batch(case.token_slots, 4),
        case.lora_a,
        case.lora_b,
        case.scaling,
        output_slices,
    )
    expected = peft_output(case)
    assert relative_error(out, expected) < 1e-6
    base = case.token_slots == NO_ADAPTER
    assert torch.equal(out[base], case.base_out[base])
    assert relative_error(expected, case.base_out) > 0.3  # the deltas are no rounding noise


def test_smaller_ranks_are_zero_padded_and_bad_shapes_refused() -> None:
    a, b = torch.randn(4, 32), torch.randn(24, 4)
    lora_a, lora_b = stack_lora_weights([None, [(a, b)]], 32, (24,), 16, torch.float32)
    assert lora_a.shape == (1, 2, 16, 32) and lora_b.shape == (2, 24, 16)
    assert torch.equal(lora_a[0, 1, :4], a) and not lora_a[0, 1, 4:].any() and not lora_a[0, 0].any()
    assert torch.equal(lora_b[1, :, :4], b) and not lora_b[1, :, 4:].any()
    with pytest.raises(ValueError, match="r <= 2"):
        stack_lora_weights([[(a, b)]], 32, (24,), 2, torch.float32)
    with pytest.raises(ValueError, match="do not fit output parts"):
        add_lora(
            torch.zeros(3, 24),
            torch.randn(3, 32),
            lora_batch(torch.zeros(3), 2),
            lora_a,
            lora_b,
            torch.ones(2),
            (12, 12),
        )


def test_column_parallel_ranks_hold_their_rows_of_each_part() -> None:
    # qkv of 4 query heads and 2 kv heads of 8: two ranks, each with 2 query heads and 1 kv head.
    slices = (32, 16, 16)
    case = make_lora_case(40, slices, 16, seed=3)
    batch = lora_batch(case.token_slots, 4)
    full = add_lora(case.base_out.clone(), case.x, batch, case.lora_a, case.lora_b, case.scaling, slices)
    for rank in range(2):
        parts = [
            slice(rank * 16, (rank + 1) * 16),
            slice(rank * 8, (rank + 1) * 8),
            slice(rank * 8, (rank + 1) * 8),
        ]
        columns = torch.cat(
            [torch.arange(o + p.start, o + p.stop) for o, p in zip((0, 32, 48), parts, strict=True)]
        )
        lora_a, lora_b, shard_slices = shard_lora(case.lora_a, case.lora_b, slices, output_parts=parts)
        assert shard_slices == (16, 8, 8)
        out = add_lora(
            case.base_out[:, columns].clone(), case.x, batch, lora_a, lora_b, case.scaling, shard_slices
        )
        assert relative_error(out, full[:, columns]) < 1e-6


def test_row_parallel_partials_over_a_quantized_base_sum_to_the_whole() -> None:
    """o_proj / down_proj: each rank adds its partial LoRA output to its partial base output, and the
    all-reduce of those is the unsharded layer with its adapters."""
    case = make_lora_case(64, (48,), 8, seed=4)
    batch = lora_batch(case.token_slots, 4)
    weight = quantize_int8(torch.randn(48, 64))
    whole = add_lora(
        reference_matmul(case.x, weight), case.x, batch, case.lora_a, case.lora_b, case.scaling, (48,)
    )
    reduced = torch.zeros_like(whole)
    for rank in range(4):
        part = slice(rank * 16, (rank + 1) * 16)
        lora_a, lora_b, _ = shard_lora(case.lora_a, case.lora_b, (48,), input_part=part)
        partial = reference_matmul(case.x[:, part], weight.columns(part))
        reduced += add_lora(partial, case.x[:, part].contiguous(), batch, lora_a, lora_b, case.scaling, (48,))
    assert relative_error(reduced, whole) < 1e-5


def test_reference_in_bf16() -> None:
    case = make_lora_case(64, (32, 32), 16, dtype=torch.bfloat16, slots=MIXED_SLOTS[:12])
    out = add_lora(
        case.base_out.clone(),
        case.x,
        lora_batch(case.token_slots, 4),
        case.lora_a,
        case.lora_b,
        case.scaling,
        case.output_slices,
    )
    assert out.dtype == torch.bfloat16
    assert relative_error(out, peft_output(case)) < 1e-2
