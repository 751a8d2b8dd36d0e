"""GGUF K-quant files as llama.cpp mixes them: Q4_K_M and Q6_K serve their projections packed and
generate what the dequantized file generates; Q5_K_M, whose main type has no packed layout, is
dequantized by --quantization auto and kept exact when served gguf; unreadable block types fail
before the model is built.

The packed K-quant scales are rounded to fp16 (quantization/gguf_blocks.py), so packed and
dequantized logits agree to about a percent of what the quantization itself moves them, not to
float32 summation order as the legacy types do (test_prequantized_loading.py).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as reference_dequantize
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.quantization.linear import DenseLinear, QuantizedLinear
from pagoda_runtime.loading.gguf_reader import GGUFError, GGUFFile
from pagoda_runtime.loading.model_source import load_model_source

from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model

from .test_prequantized_loading import PROMPTS, _engine, _greedy

# K-quant blocks are 256 weights long: every row of the tiny model must be a multiple of that.
K_SIZES = {"hidden_size": 256, "intermediate_size": 512}
# Where the exactly dequantized file's best next token leads the packed model's choice by less than
# this share of its largest logit, the packed scales' fp16 rounding (0.1 to 0.6% of the logits) may
# pick the other: a tie, not an error. Tiny random models meet such ties every few dozen tokens.
NEAR_TIE = 0.01


@pytest.fixture(scope="module")
def k_folder(tmp_path_factory):
    # smollm is a llama with tied embeddings: the file's q/k rows are permuted and come back whole.
    return build_tiny_model(tmp_path_factory.mktemp("k") / "smollm", "smollm", overrides=K_SIZES)


def _layer(engine: LLMEngine, index: int, name: str) -> QuantizedLinear:
    layer = engine.runner.model.layers[index]
    return getattr(layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp, name)


def _layout(layer: QuantizedLinear) -> list[tuple[str, int]]:
    """(kind, group size) of each row block of a layer, or of the whole layer."""
    blocks = layer.row_blocks if layer.row_blocks is not None else [layer]
    return [("float", 0) if isinstance(b, DenseLinear) else (b.kind, b.group_size) for b in blocks]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def assert_same_greedy_choices(engine: LLMEngine, reference: LLMEngine) -> None:
    """At every step of the reference's greedy generations (teacher-forced), the engine's choice is
    the reference's best token, or ties with it within NEAR_TIE."""
    for prompt, generated in zip(PROMPTS, _greedy(reference), strict=True):
        prompt_ids = reference.tokenizer.encode(prompt)
        ids = prompt_ids + generated
        got, want = score(engine, ids), score(reference, ids)
        for row in range(len(prompt_ids) - 1, len(ids) - 1):
            lead = want[row].max() - want[row, int(got[row].argmax())]
            assert lead <= NEAR_TIE * want[row].abs().max(), (prompt, row - len(prompt_ids) + 1, float(lead))


@pytest.mark.parametrize(
    "file_type,first_layer,second_layer",
    [
        # llama.cpp's Q4_K_M: attn_v and ffn_down in Q6_K in the layers use_more_bits picks (of two
        # layers, the last), the rest Q4_K.
        (
            "Q4_K_M",
            {"qkv_proj": [("int4", 32)], "down_proj": [("int4", 32)]},
            {"qkv_proj": [("int4", 32), ("int8", 16)], "down_proj": [("int8", 16)]},
        ),
        ("Q6_K", {"qkv_proj": [("int8", 16)], "down_proj": [("int8", 16)]}, None),
    ],
)
def test_k_quant_files_serve_packed_and_generate_what_the_dequantized_file_generates(
    k_folder, tmp_path, file_type, first_layer, second_layer
):
    path = build_tiny_gguf(k_folder, tmp_path / f"tiny.{file_type}.gguf", file_type)
    engine, reference = _engine(path, "gguf"), _engine(path, "none")
    assert engine.quantization == "gguf" and reference.quantization == "none"
    for index, expected in enumerate([first_layer, second_layer or first_layer]):
        for name, layout in expected.items():
            assert _layout(_layer(engine, index, name)) == layout, (index, name)
    # Sized by the file's name, as the operator sizes it: never below what the weights take.
    memory = engine.memory
    assert memory.weight_bytes <= memory.predicted_weight_bytes < memory.weight_bytes * 1.1
    assert memory.weight_bytes * 2 < reference.memory.weight_bytes  # float32 beside 5 to 9 bits

    ids = engine.tokenizer.encode(" ".join(PROMPTS))
    packed, dequantized = score(engine, ids), score(reference, ids)
    assert _relative(packed, dequantized) < 0.02  # measured 0.6% (Q4_K_M), the fp16 scales
    assert_same_greedy_choices(engine, reference)


def test_dequantized_k_quant_weights_are_the_files_values_bit_for_bit(k_folder, tmp_path):
    path = build_tiny_gguf(k_folder, tmp_path / "tiny.Q4_K_M.gguf", "Q4_K_M")
    raw = GGUFFile(path)
    weights = dict(load_model_source(path).weights)  # dequantized: not through the packed fp16 scales
    for gguf_name, hf_name in [
        ("blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj.weight"),  # Q6_K
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),  # Q4_K
    ]:
        info = raw.tensors[gguf_name]
        expected = reference_dequantize(raw.raw_bytes(gguf_name), gguf.GGMLQuantizationType(info.ggml_type))
        np.testing.assert_array_equal(weights[hf_name].numpy(), expected.reshape(info.shape))


def test_a_q5_k_m_file_is_dequantized_by_auto_and_exact_when_served_gguf(k_folder, tmp_path):
    path = build_tiny_gguf(k_folder, tmp_path / "tiny.Q5_K_M.gguf", "Q5_K_M")
    config = EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_memory=8 * 2**20)
    # --dtype auto on the CPU would keep a Q4_K_M file packed; Q5_K has no packed layout.
    assert LLMEngine(config).quantization == "none"

    engine, reference = _engine(path, "gguf"), _engine(path, "none")
    # Q5_K projections stay float, as dequantized; the Q6_K attn_v and ffn_down of the last layer
    # are packed beside them.
    assert _layout(_layer(engine, 1, "qkv_proj")) == [("float", 0), ("float", 0), ("int8", 16)]
    assert _layout(_layer(engine, 1, "down_proj")) == [("int8", 16)]
    assert _layout(_layer(engine, 0, "gate_up_proj")) == [("float", 0), ("float", 0)]
    ids = engine.tokenizer.encode(" ".join(PROMPTS))
    assert _relative(score(engine, ids), score(reference, ids)) < 0.005
    assert _greedy(engine) == _greedy(reference)


def test_auto_reads_the_block_type_from_the_tensors_when_the_file_name_does_not_say_it(k_folder, tmp_path):
    path = build_tiny_gguf(k_folder, tmp_path / "tiny.gguf", "Q4_K_M")
    config = EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_memory=8 * 2**20)
    engine = LLMEngine(config)  # --dtype auto: packed through the CPU's int4 kernel
    assert engine.quantization == "gguf"
    # The name does not say Q4_K_M, so the prediction is the file's main type, without the wider
    # attn_v and ffn_down: the one case where the report may fall short of the bytes held.
    assert engine.memory.predicted_weight_bytes == pytest.approx(engine.memory.weight_bytes, rel=0.1)


def test_a_block_type_pagoda_cannot_read_fails_before_the_model_is_built(tmp_path):
    path = tmp_path / "model.IQ2_XXS.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor(
        "blk.0.attn_q.weight", np.zeros((4, 66), np.uint8), raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match="ggml type IQ2_XXS, which Pagoda cannot read.*to Q4_K_M"):
        LLMEngine(EngineConfig(model=str(path), device="cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q6_K"])
def test_k_quants_stay_packed_on_the_gpu_and_match_the_dequantized_file(k_folder, tmp_path, file_type):
    from pagoda_runtime import LLM, SamplingParams

    path = build_tiny_gguf(k_folder, tmp_path / f"tiny.{file_type}.gguf", file_type)
    kwargs = dict(dtype="float32", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    kept, dense = LLM(str(path), **kwargs), LLM(str(path), quantization="none", **kwargs)
    assert (kept.engine.quantization, dense.engine.quantization) == ("gguf", "none")
    ids = kept.get_tokenizer().encode(" ".join(PROMPTS))
    # Triton's GEMV (decode) and GEMM (prefill) over int4 groups of 32 and int8 groups of 16,
    # row blocks included, against the exactly dequantized file: the fp16 scales' percent.
    assert _relative(score(kept.engine, ids), score(dense.engine, ids)) < 0.02
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    graphs = [o.outputs[0].token_ids for o in kept.generate(PROMPTS, greedy)]
    eager = LLM(str(path), enforce_eager=True, **kwargs)
    assert graphs == [o.outputs[0].token_ids for o in eager.generate(PROMPTS, greedy)]
    assert_same_greedy_choices(kept.engine, dense.engine)
