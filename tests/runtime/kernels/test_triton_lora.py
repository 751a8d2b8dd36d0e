"""The Triton LoRA shrink and expand kernels compute what the PyTorch reference computes on mixed
steps (three adapters and base-model tokens, prefill runs and decode tokens, fused projections'
parts): compiled on a GPU, in Triton's interpreter on a CPU-only machine."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.kernels import triton_lora
from pagoda_runtime.executor.kernels.lora_reference import reference_add_lora, reference_shrink
from pagoda_runtime.executor.kernels.lora_slots import NO_ADAPTER, lora_batch

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


# On a CUDA GPU: Llama-3-8B's projections, bf16, against the reference.
LLAMA3_8B = {"qkv": (4096, (4096, 1024, 1024)), "gate_up": (4096, (14336, 14336)), "down": (14336, (4096,))}


@pytest.mark.gpu
@pytest.mark.parametrize("projection", list(LLAMA3_8B))
@pytest.mark.parametrize("rank", [8, 16, 64])
def test_llama_projections_on_the_gpu(projection: str, rank: int) -> None:
    in_features, parts = LLAMA3_8B[projection]
    # A prefill chunk of 300 tokens, then mixed decode tokens of every slot and the base model.
    slots = [0] * 300 + [i % 5 - 1 for i in range(61)]
    case = make_lora_case(
        in_features, parts, rank, dtype=torch.bfloat16, slots=slots, device="cuda", seed=rank
    )
    out = case.base_out.clone()
    triton_lora.add_lora(
        out, case.x, lora_batch(case.token_slots, 4), case.lora_a, case.lora_b, case.scaling, parts
    )
    assert relative_error(out, _reference(case)) < 2e-3


@pytest.mark.gpu
def test_a_captured_decode_step_follows_new_adapters() -> None:
    """A CUDA graph captured with one assignment of adapters to tokens serves any other."""
    case = make_lora_case(4096, (4096, 1024, 1024), 16, dtype=torch.bfloat16, slots=[0] * 32, device="cuda")
    slots = case.token_slots.clone()
    out = case.base_out.clone()

    def step():
        out.copy_(case.base_out)
        batch = lora_batch(slots, 4)
        triton_lora.add_lora(out, case.x, batch, case.lora_a, case.lora_b, case.scaling, case.output_slices)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(3):
        new = torch.randint(-1, 4, (32,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
        slots.copy_(new.cuda())
        graph.replay()
        expected = reference_add_lora(
            case.base_out.clone(), case.x, slots, case.lora_a, case.lora_b, case.scaling, case.output_slices
        )
        assert relative_error(out, expected) < 2e-3
