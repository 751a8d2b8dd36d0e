"""GGUF files of the families llama.cpp writes (qwen3, qwen3moe, gemma2, gemma3, phi3), converted from
tiny Hugging Face folders the way llama.cpp's converter does: the metadata gives the folder's
config, the tensors its weights under their Hugging Face names, and Q8_0 blocks served packed keep
the model's predictions. K-quant files mixed as llama.cpp's llama-quantize mixes them (Q4_K_M,
Q6_K, and Q5_K_M for the experts without a packed layout) serve each part packed in its block
type's layout, choose the dequantized file's greedy tokens, dequantize bit for bit as the gguf
package does, and a mixture-of-experts file's weights are sized exactly, expert by expert."""

import dataclasses

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as reference_dequantize
from pagoda_runtime.contract.sizing import decode_weight_bytes
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.quantization.linear import DenseLinear
from pagoda_runtime.executor.quantization.quality import compare
from pagoda_runtime.loading.gguf_reader import GGUFFile
from pagoda_runtime.loading.model_source import load_model_source

from tests.runtime.quantization.test_gguf_k_quants import _relative, assert_same_greedy_choices
from tests.runtime.quantization.test_prequantized_loading import PROMPTS, _engine
from tests.runtime.tiny_models import FAMILY_VARIANTS, build_tiny_gguf, build_tiny_model

# Mean KL of the Llama family's tiny models (gqa, qwen2) in Q8_0 files against their float folders,
# every 2-D tensor quantized as here (2026-11-26, this module's measurement): the largest, gqa's.
# A family passes within 4 times it (Gemma 3's is 0.0074, its q/k norms amplifying the rounding).
LLAMA_FAMILY_Q8_0_KL = 0.0027
# Pattern-fixed metadata llama.cpp's loader assumes (query_pre_attn_scalar = head_dim) where the
# file cannot say otherwise.
GGUF_FAMILIES = {
    "qwen3": None,
    "qwen3_moe": None,  # its dense layer 1 has no router in the file either
    "gemma2": {"query_pre_attn_scalar": 16},
    "gemma3": None,
    "phi3": None,
}


@pytest.fixture(scope="module", params=sorted(GGUF_FAMILIES))
def folder(request, tmp_path_factory):
    variant = request.param
    return build_tiny_model(
        tmp_path_factory.mktemp(variant), variant, overrides=GGUF_FAMILIES[variant], tokenizer="chatml"
    )


def test_gguf_gives_the_folders_config_and_weights(folder, tmp_path):
    expected = load_model_source(folder)
    loaded = load_model_source(build_tiny_gguf(folder, tmp_path / "model.gguf"))
    assert loaded.config.architecture == expected.config.architecture
    # GGUF stores floats in 32 bits and end-of-sequence tokens as the tokenizer's.
    got, want = _fields(loaded.config), _fields(expected.config)
    numbers = [k for k, v in want.items() if isinstance(v, float)]
    assert {k: got[k] for k in numbers} == pytest.approx({k: want[k] for k in numbers}, rel=1e-6)
    assert {k: v for k, v in got.items() if k not in numbers} == {
        k: v for k, v in want.items() if k not in numbers
    }
    weights = dict(expected.weights)
    got = dict(loaded.weights)
    assert got.keys() == weights.keys()
    for name, tensor in weights.items():
        # Gemma's norms come back from llama.cpp's "weight + 1" through float32.
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6, msg=name)


def _fields(config) -> dict:
    """Every computation field of a ModelConfig, tuples and the rope scaling spread out."""
    flat = {}
    for name, value in dataclasses.asdict(config).items():
        if name in ("architecture", "eos_token_ids", "bos_token_id"):
            continue
        for key, item in (value or {}).items() if isinstance(value, dict) else [("", value)]:
            items = item if isinstance(item, tuple) else (item,)
            flat |= {
                f"{name}.{key}.{i}": float(x) if isinstance(x, float) else x for i, x in enumerate(items)
            }
    return flat


def test_q8_0_blocks_are_served_packed_and_keep_the_predictions(folder, tmp_path):
    from tests.runtime.engine.test_families_logits import TEXT, prefill_logits

    path = build_tiny_gguf(folder, tmp_path / "model.Q8_0.gguf", "Q8_0")
    packed = load_model_source(path, keep_quantized=True)
    assert packed.quantization == "gguf" and packed.gguf_block == "Q8_0"
    tokens = torch.tensor(packed.tokenizer.encode(TEXT))
    served = prefill_logits(path, tokens, torch.float32, "gguf")
    # Packed, the blocks compute what the file's dequantized weights compute...
    dequantized = prefill_logits(path, tokens, torch.float32)
    torch.testing.assert_close(served, dequantized, rtol=1e-4, atol=1e-4 * float(dequantized.abs().max()))
    # ... which stays as close to the float model as the Llama family's Q8_0 files do.
    report = compare(prefill_logits(folder, tokens, torch.float32), served, tokens)
    assert report.mean_kl <= 4 * LLAMA_FAMILY_Q8_0_KL, report


# ---- K-quant files (Q4_K_M, Q5_K_M, Q6_K) ----------------------------------------------------------

# K-quant blocks are 256 weights long, so every row of these tiny models is a multiple of that: heads
# of 64 (o_proj's inputs are 4 of them), MLPs and experts 256 or 512 wide. Qwen3-MoE's sparse layer
# is the last, the one llama.cpp's use_more_bits gives Q6_K down projections (of two layers).
_K = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64}
_PHI3_ROPE = FAMILY_VARIANTS["phi3"][2]["rope_parameters"]
K_FAMILIES = {
    "qwen3": _K,
    "qwen3_moe": {**_K, "moe_intermediate_size": 256, "mlp_only_layers": [0]},
    "gemma2": {**_K, "query_pre_attn_scalar": 64},
    "gemma3": {**_K, "query_pre_attn_scalar": 64},
    # LongRoPE's factors are per rotated frequency: 16 of head_dim 64, half of it rotated.
    "phi3": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "rope_parameters": {
            **_PHI3_ROPE,
            "short_factor": [1.0 + 0.05 * i for i in range(16)],
            "long_factor": [1.5 + 0.1 * i for i in range(16)],
        },
    },
}
FLOAT = [("float", 0)]
Q4_K, Q6_K, Q8_0 = [("int4", 32)], [("int8", 16)], [("int8", 32)]
# Layer 1's projections as served from each file (the layer llama.cpp widens): packed in the layout
# of each part's block type, floats where it has none. Qwen3-MoE has 8 experts, for which llama.cpp
# stores attn_k and attn_v in Q8_0 and (Q4_K_M) attn_output in Q5_K; Phi-3's fused attn_qkv is Q5_K
# in Q4_K_M.
SERVED = {
    ("dense", "Q4_K_M"): {"qkv_proj": Q4_K + Q6_K, "o_proj": Q4_K, "gate_up_proj": Q4_K, "down_proj": Q6_K},
    ("dense", "Q6_K"): {"qkv_proj": Q6_K, "o_proj": Q6_K, "gate_up_proj": Q6_K, "down_proj": Q6_K},
    ("phi3", "Q4_K_M"): {"qkv_proj": FLOAT * 3, "o_proj": Q4_K, "gate_up_proj": Q4_K, "down_proj": Q6_K},
    ("phi3", "Q6_K"): {"qkv_proj": Q6_K, "o_proj": Q6_K, "gate_up_proj": Q6_K, "down_proj": Q6_K},
    ("qwen3_moe", "Q4_K_M"): {
        "qkv_proj": Q4_K + Q8_0 * 2,
        "o_proj": FLOAT,
        "experts_gate_up": Q4_K,
        "experts_down": Q6_K,
    },
    ("qwen3_moe", "Q6_K"): {
        "qkv_proj": Q6_K + Q8_0 * 2,
        "o_proj": Q6_K,
        "experts_gate_up": Q6_K,
        "experts_down": Q6_K,
    },
    # Q5_K experts have no packed layout: floats for the grouped kernel, the Q6_K down ones packed.
    ("qwen3_moe", "Q5_K_M"): {"qkv_proj": FLOAT + Q8_0 * 2, "experts_gate_up": FLOAT, "experts_down": Q6_K},
}


@pytest.fixture(scope="module")
def k_folders(tmp_path_factory):
    """variant -> its tiny folder, built once."""
    folders = {}

    def folder(variant: str):
        if variant not in folders:
            path = tmp_path_factory.mktemp(variant) / variant
            folders[variant] = build_tiny_model(
                path, variant, overrides=K_FAMILIES[variant], tokenizer="chatml"
            )
        return folders[variant]

    return folder


def _served(engine, projection: str) -> list[tuple[str, int]]:
    layer = engine.runner.model.layers[1]
    module = getattr(layer.self_attn if projection in ("qkv_proj", "o_proj") else layer.mlp, projection)
    blocks = getattr(module, "row_blocks", None) or [module]
    return [("float", 0) if isinstance(b, DenseLinear) else (b.kind, b.group_size) for b in blocks]


@pytest.mark.parametrize(
    "variant,file_type",
    [(v, t) for v in sorted(K_FAMILIES) for t in ("Q4_K_M", "Q6_K")] + [("qwen3_moe", "Q5_K_M")],
)
def test_k_quant_files_serve_packed_and_choose_the_dequantized_files_tokens(
    k_folders, tmp_path, variant, file_type
):
    family = variant if variant in ("phi3", "qwen3_moe") else "dense"
    path = build_tiny_gguf(k_folders(variant), tmp_path / f"tiny.{file_type}.gguf", file_type)
    engine, reference = _engine(path, "gguf"), _engine(path, "none")
    assert engine.quantization == "gguf" and reference.quantization == "none"
    for projection, layout in SERVED[family, file_type].items():
        assert _served(engine, projection) == layout, projection

    memory = engine.memory
    if variant == "qwen3_moe" and file_type != "Q5_K_M":
        # Sized tensor by tensor as the operator sizes the file's name: each expert in its own type,
        # and a decode step reads the routed experts of each layer in theirs.
        assert memory.predicted_weight_bytes == memory.weight_bytes
        read = decode_weight_bytes(engine.model_config.architecture, "gguf", "float32", file_type)
        assert engine.runner.decode_weight_bytes == read
    else:
        assert memory.weight_bytes <= memory.predicted_weight_bytes < memory.weight_bytes * 1.2
    assert memory.weight_bytes < reference.memory.weight_bytes * (0.85 if file_type == "Q5_K_M" else 0.5)

    ids = engine.tokenizer.encode(" ".join(PROMPTS))
    assert _relative(score(engine, ids), score(reference, ids)) < 0.02  # measured at most 0.6%
    assert_same_greedy_choices(engine, reference)


# Per family, tensors of each block type a Q4_K_M file gives it: (GGUF tensor, expert, Hugging Face name).
K_TENSORS = {
    "qwen3": [("blk.1.attn_v.weight", None, "model.layers.1.self_attn.v_proj.weight")],
    "qwen3_moe": [
        ("blk.1.ffn_down_exps.weight", 3, "model.layers.1.mlp.experts.3.down_proj.weight"),  # Q6_K
        ("blk.1.ffn_gate_exps.weight", 5, "model.layers.1.mlp.experts.5.gate_proj.weight"),  # Q4_K
        ("blk.0.attn_k.weight", None, "model.layers.0.self_attn.k_proj.weight"),  # Q8_0
        ("blk.1.attn_output.weight", None, "model.layers.1.self_attn.o_proj.weight"),  # Q5_K
    ],
    "gemma2": [("blk.1.ffn_down.weight", None, "model.layers.1.mlp.down_proj.weight")],
    "gemma3": [("blk.0.ffn_gate.weight", None, "model.layers.0.mlp.gate_proj.weight")],
    "phi3": [
        ("blk.0.attn_qkv.weight", None, "model.layers.0.self_attn.qkv_proj.weight"),  # Q5_K
        ("blk.1.ffn_up.weight", None, "model.layers.1.mlp.gate_up_proj.weight"),  # Q4_K
    ],
}


@pytest.mark.parametrize("variant", sorted(K_FAMILIES))
def test_dequantized_k_quant_weights_are_the_files_values_bit_for_bit(k_folders, tmp_path, variant):
    path = build_tiny_gguf(k_folders(variant), tmp_path / "tiny.Q4_K_M.gguf", "Q4_K_M")
    raw = GGUFFile(path)
    weights = dict(load_model_source(path).weights)
    for gguf_name, expert, hf_name in K_TENSORS[variant]:
        info = raw.tensors[gguf_name]
        expected = reference_dequantize(raw.raw_bytes(gguf_name), gguf.GGMLQuantizationType(info.ggml_type))
        expected = expected.reshape(info.shape)
        np.testing.assert_array_equal(
            weights[hf_name].numpy(), expected if expert is None else expected[expert]
        )


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(K_FAMILIES))
def test_k_quant_files_stay_packed_on_the_gpu_and_choose_the_dequantized_files_tokens(
    k_folders, tmp_path, variant
):
    from pagoda_runtime import LLM

    path = build_tiny_gguf(k_folders(variant), tmp_path / "tiny.Q4_K_M.gguf", "Q4_K_M")
    kwargs = dict(dtype="float32", device="cuda", max_num_seqs=4, kv_cache_memory=2**26)
    kept, dense = LLM(str(path), **kwargs), LLM(str(path), quantization="none", **kwargs)
    assert (kept.engine.quantization, dense.engine.quantization) == ("gguf", "none")
    family = variant if variant in ("phi3", "qwen3_moe") else "dense"
    for projection, layout in SERVED[family, "Q4_K_M"].items():
        assert _served(kept.engine, projection) == layout, projection
    # Triton's GEMV, GEMM and grouped MoE kernels over int4 groups of 32 and int8 groups of 16 and
    # 32, row blocks included, against the exactly dequantized file.
    ids = kept.get_tokenizer().encode(" ".join(PROMPTS))
    assert _relative(score(kept.engine, ids), score(dense.engine, ids)) < 0.02
    assert_same_greedy_choices(kept.engine, dense.engine)
