"""The LM head's logits are float32 on every path: a near tie the model's own weights decide stays
decided, where logits rounded to 16 bits would make it an exact tie (or flip it)."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.vocab_parallel import VocabParallel
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS

VOCAB, HIDDEN = 1000, 64


def near_tie(dtype: torch.dtype, device: str = "cpu") -> tuple[VocabParallel, torch.Tensor]:
    """A head whose tokens 0 and 1 score about 20.04 and 20.0 for the returned hidden state:
    bfloat16 logits there are 0.125 apart and cannot tell them apart."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator) * 0.02
    hidden = torch.randn(1, HIDDEN, generator=generator)
    direction = hidden[0] / hidden[0].norm() ** 2
    weight[0], weight[1] = direction * 20.04, direction * 20.0
    head = VocabParallel(VOCAB, HIDDEN, SINGLE_PROCESS, torch.device(device), dtype)
    head.load(weight)
    return head, hidden.to(device, dtype)


def reference(head: VocabParallel, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden.double() @ weight.double().t()).float()


def test_the_cpu_16_bit_head_keeps_float32_logits_and_lookups():
    head, hidden = near_tie(torch.float32)
    weight16 = head.weight.detach().to(torch.float16)
    head.hold_in(torch.float16, lookups=True, logits=True)
    logits = head.logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (1, VOCAB)
    torch.testing.assert_close(logits, reference(head, hidden, weight16), rtol=1e-5, atol=1e-5)
    assert logits[0, 0] - logits[0, 1] == pytest.approx(0.04, abs=5e-3)
    assert int(logits.argmax()) == 0
    # bfloat16 logits, as torch's CPU matmul returns them, lose the lead.
    rounded = torch.nn.functional.linear(hidden.bfloat16(), weight16.bfloat16())
    assert rounded[0, 0] == rounded[0, 1]
    # Lookups read the 16-bit table and come out in the activations' dtype.
    ids = torch.tensor([0, 5, VOCAB - 1])
    torch.testing.assert_close(head(ids), weight16[ids].float(), rtol=0, atol=0)
    # Tied: the lookup table and a packed copy for the head, 2 bytes a weight each.
    assert head.weight.dtype == torch.float16 and head.head_bytes == VOCAB * HIDDEN * 2


def test_an_untied_cpu_head_keeps_only_its_packed_copy():
    head, hidden = near_tie(torch.float32)
    weight16 = head.weight.detach().to(torch.float16)
    head.hold_in(torch.float16, lookups=False, logits=True)
    assert head.weight.numel() == 0 and head.head_bytes == VOCAB * HIDDEN * 2
    torch.testing.assert_close(head.logits(hidden), reference(head, hidden, weight16), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_head_in_the_model_dtype_on_the_cpu_returns_float32(dtype):
    head, hidden = near_tie(dtype)
    logits = head.logits(hidden)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference(head, hidden, head.weight.detach()), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gpu_head_accumulates_and_returns_float32(dtype):
    head, hidden = near_tie(dtype, "cuda")
    logits = head.logits(hidden)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference(head, hidden, head.weight.detach()), rtol=1e-5, atol=1e-4)
    assert int(logits.argmax()) == 0
