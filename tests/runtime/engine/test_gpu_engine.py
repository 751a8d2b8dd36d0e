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
    for prompt_ids, ids in zip(
        (o.prompt_token_ids for o in graphs.generate(PROMPTS, GREEDY)), with_graphs, strict=True
    ):
        expected = hf_greedy(reference, prompt_ids, NEW_TOKENS, device="cuda")
        assert ids == expected


def test_bfloat16_graphs_equal_eager(tmp_path):
    folder = build_tiny_model(tmp_path / "llama3", "llama3")
    kwargs = dict(dtype="bfloat16", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    # Five prompts on four sequence slots: decode batches of 1 to 4 replay different graphs.
    assert _token_ids(LLM(str(folder), **kwargs), PROMPTS) == _token_ids(
        LLM(str(folder), enforce_eager=True, **kwargs), PROMPTS
    )


def test_fp8_kv_cache_graphs_equal_eager(tmp_path):
    folder = build_tiny_model(tmp_path / "gqa", "gqa")
    kwargs = dict(dtype="bfloat16", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    kwargs["kv_cache_dtype"] = "fp8"
    graphs = LLM(str(folder), **kwargs)
    assert graphs.engine.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    assert _token_ids(graphs, PROMPTS) == _token_ids(LLM(str(folder), enforce_eager=True, **kwargs), PROMPTS)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_awq_and_gptq_folders_serve_on_the_gpu_close_to_their_dequantized_weights(tmp_path, method):
    from pagoda_runtime.model_source import load_model_source

    from tests.runtime.quantization.quantized_folders import build_quantized_folder

    float_folder = build_tiny_model(tmp_path / "gqa", "gqa")
    folder = build_quantized_folder(float_folder, tmp_path / method, method)
    kwargs = dict(dtype="float32", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    llm = LLM(str(folder), **kwargs)
    assert llm.engine.quantization == method
    reference = AutoModelForCausalLM.from_pretrained(float_folder, dtype=torch.float32).cuda().eval()
    reference.load_state_dict(dict(load_model_source(folder).weights), strict=False)
    ids = llm.get_tokenizer().encode(" ".join(PROMPTS))
    with torch.inference_mode():
        expected = reference(torch.tensor([ids], device="cuda")).logits[0].float()
    logits = llm.engine.score(ids)
    assert float((logits - expected).norm() / expected.norm()) < 1e-3
    assert _token_ids(llm, PROMPTS) == _token_ids(LLM(str(folder), enforce_eager=True, **kwargs), PROMPTS)


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
def test_gguf_blocks_are_kept_packed_by_default_on_the_gpu_and_match_the_dequantized_file(
    tmp_path, ggml_type
):
    from tests.runtime.tiny_models import build_tiny_gguf

    path = build_tiny_gguf(build_tiny_model(tmp_path / "gqa", "gqa"), tmp_path / "m.gguf", ggml_type)
    kwargs = dict(dtype="float32", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    kept, dense = LLM(str(path), **kwargs), LLM(str(path), quantization="none", **kwargs)
    assert (kept.engine.quantization, dense.engine.quantization) == ("gguf", "none")
    ids = kept.get_tokenizer().encode(" ".join(PROMPTS))
    logits, expected = kept.engine.score(ids), dense.engine.score(ids)
    assert float((logits - expected).norm() / expected.norm()) < 1e-3
    assert _token_ids(kept, PROMPTS) == _token_ids(LLM(str(path), enforce_eager=True, **kwargs), PROMPTS)
