"""AWQ and GPTQ tensors, packed here the way AutoAWQ and AutoGPTQ pack them, convert exactly."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.quantization.hf_checkpoints import (
    awq_to_packed,
    gptq_to_packed,
    parse_quantization_config,
)
from pagoda_runtime.executor.quantization.packed import dequantize

from .quantized_folders import AWQ_ORDER, NATURAL_ORDER, pack_columns

K, N, GROUP = 256, 64, 128


def _problem():
    torch.manual_seed(0)
    q = torch.randint(0, 16, (K, N))
    zeros = torch.randint(0, 16, (K // GROUP, N))
    scales = (torch.rand(K // GROUP, N) * 0.02 + 0.001).half()
    expected = (
        (q - zeros.repeat_interleave(GROUP, 0)).float() * scales.float().repeat_interleave(GROUP, 0)
    ).t()
    return q, zeros, scales, expected


def test_awq_gemm_layout_converts_to_the_same_weights() -> None:
    q, zeros, scales, expected = _problem()
    packed = awq_to_packed(pack_columns(q, AWQ_ORDER), pack_columns(zeros, AWQ_ORDER), scales, GROUP)
    assert torch.allclose(dequantize(packed), expected, atol=2e-4)


def test_gptq_layout_with_zero_minus_one_converts_to_the_same_weights() -> None:
    q, zeros, scales, expected = _problem()
    qweight = pack_columns(q.t().contiguous(), NATURAL_ORDER).t().contiguous()  # packed along the inputs
    qzeros = pack_columns((zeros - 1) & 0xF, NATURAL_ORDER)
    spec = parse_quantization_config(
        {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    )
    g_idx = torch.arange(K, dtype=torch.int32) // GROUP
    packed = gptq_to_packed(qweight, qzeros, scales, g_idx, spec)
    # Zero 0 is stored as 15 (= -1 in four bits) and comes back as 16: AutoGPTQ's own behaviour.
    restored = torch.where(zeros == 0, 16, zeros)
    expected = (
        (q - restored.repeat_interleave(GROUP, 0)).float() * scales.float().repeat_interleave(GROUP, 0)
    ).t()
    assert torch.allclose(dequantize(packed), expected, atol=2e-4)


def test_gptq_act_order_is_refused() -> None:
    with pytest.raises(ValueError, match="act-order"):
        parse_quantization_config(
            {"quantization_config": {"quant_method": "gptq", "bits": 4, "desc_act": True}}
        )
    spec = parse_quantization_config({"quantization_config": {"quant_method": "gptq", "bits": 4}})
    shuffled = torch.randperm(K).to(torch.int32) // GROUP
    with pytest.raises(ValueError, match="act-order"):
        gptq_to_packed(
            torch.zeros(K // 8, N, dtype=torch.int32),
            torch.zeros(2, N // 8, dtype=torch.int32),
            torch.ones(2, N).half(),
            shuffled,
            spec,
        )


@pytest.mark.parametrize(
    "config,message",
    [
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "'gemv' layout"),
        ({"quant_method": "gptq", "bits": 8}, "8-bit"),
        ({"quant_method": "bitsandbytes"}, "'bitsandbytes'"),
    ],
)
def test_unsupported_layouts_are_refused_by_name(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_quantization_config({"quantization_config": config})


def test_a_float_checkpoint_has_no_quantization() -> None:
    assert parse_quantization_config({"architectures": ["LlamaForCausalLM"]}) is None
