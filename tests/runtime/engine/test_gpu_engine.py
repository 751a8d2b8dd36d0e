"""On a CUDA GPU: CUDA-graph decode gives exactly the eager tokens, and float32 greedy tokens equal
transformers' on the same device, across batch sizes that fall between graph buckets."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from transformers import AutoModelForCausalLM

from tests.runtime.engine.hf_reference import hf_greedy
from tests.runtime.tiny_models import build_tiny_model

pytestmark = pytest.mark.gpu

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
PROMPTS = [
    "Hello, world! How are",
    "def add(a, b):",
    "The quick brown fox jumps over the lazy dog. She",
    "1, 2, 3, 4,",
    "Once upon a time",
]


def _token_ids(llm: LLM, prompts: list[str]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("variant", ["llama3", "gqa"])
def test_graphs_equal_eager_and_transformers_in_float32(tmp_path, variant):
    folder = build_tiny_model(tmp_path / variant, variant)
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=6, kv_cache_memory=2**26)
    graphs = LLM(str(folder), **kwargs)
    assert graphs.engine.runner._graphs, "decode graphs were not captured"
    with_graphs = _token_ids(graphs, PROMPTS)
    eager = _token_ids(LLM(str(folder), enforce_eager=True, **kwargs), PROMPTS)
    assert with_graphs == eager
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
    for prompt_ids, ids in zip((o.prompt_token_ids for o in graphs.generate(PROMPTS, GREEDY)), with_graphs,
                               strict=True):
        expected = hf_greedy(reference, prompt_ids, NEW_TOKENS, device="cuda")
        assert ids == expected


def test_bfloat16_graphs_equal_eager(tmp_path):
    folder = build_tiny_model(tmp_path / "llama3", "llama3")
    kwargs = dict(dtype="bfloat16", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    # Five prompts on four sequence slots: decode batches of 1 to 4 replay different graphs.
    assert _token_ids(LLM(str(folder), **kwargs), PROMPTS) == _token_ids(
        LLM(str(folder), enforce_eager=True, **kwargs), PROMPTS
    )
