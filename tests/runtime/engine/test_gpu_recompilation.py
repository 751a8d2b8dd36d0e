"""On a CUDA GPU, once the engine is warm no request compiles a Triton kernel again: the block-table
width, the number of rows and the context lengths change from step to step, but none of them is a
compile-time constant or a specialized argument."""

from __future__ import annotations

import pytest
import torch
import triton
from pagoda_runtime import LLM, SamplingParams

from tests.runtime.tiny_models import build_tiny_model

pytestmark = pytest.mark.gpu


def _prompts(lengths: list[int]) -> list[list[int]]:
    return [[(7 * i + j) % 300 + 10 for j in range(n)] for i, n in enumerate(lengths)]


@pytest.mark.parametrize("quantization", ["none", "int4", "int8"])
def test_no_triton_compilation_after_warm_up(tmp_path, quantization):
    folder = build_tiny_model(tmp_path / "gqa", "gqa")
    llm = LLM(
        str(folder),
        dtype="bfloat16",
        device="cuda",
        quantization=quantization,
        max_num_seqs=8,
        kv_cache_memory=2**27,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    # Warm-up: decode graphs were captured at start; these prefills cover each row-count class of
    # the projections (1 to 4 rows, up to 16, up to 64, more).
    for lengths in ([3], [2, 2], [12], [40], [150, 30]):
        llm.generate(_prompts(lengths), params)
    compiled: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda *, repr, **_: compiled.append(repr)
    try:
        # Other lengths, batch sizes and block-table widths than the warm-up's.
        for lengths in ([5, 9, 33], [90, 17, 4, 61, 200], [1], [300, 250, 2, 3, 77, 8, 19, 130]):
            llm.generate(_prompts(lengths), params)
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.jit_post_compile_hook = None
    assert compiled == [], "\n".join(compiled)
