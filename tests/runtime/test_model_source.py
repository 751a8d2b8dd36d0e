"""Loading Hugging Face folders and GGUF files: config, weights under HF names, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from pagoda_runtime.contract.bundled import bundled_model_path
from pagoda_runtime.loading.gguf_reader import GGUFError
from pagoda_runtime.loading.model_source import ModelLoadError, load_model_source
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model

# The Llama family's variants, whose config fields this reads as Llama's; the other families'
# configs and weights are checked against transformers in test_families_logits.py and
# test_family_gguf.py.
LLAMA_FAMILY = ["gqa", "llama2", "llama3", "llama_linear_rope", "mistral", "qwen2", "smollm"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        (variant, sharded): build_tiny_model(root / f"{variant}-{sharded}", variant, sharded=sharded)
        for variant in LLAMA_FAMILY
        for sharded in (False, True)
    }


def _copy(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "model")


def _reference_weights(folder, tied):
    state = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    return {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")}


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("variant", LLAMA_FAMILY)
def test_hf_folder_gives_transformers_weights_and_config(folders, variant, sharded):
    folder = folders[variant, sharded]
    loaded = load_model_source(folder)
    hf = AutoConfig.from_pretrained(folder)
    config, arch = loaded.config, loaded.config.architecture
    assert (arch.num_attention_heads, arch.num_key_value_heads) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
    )
    assert arch.head_dim == hf.hidden_size // hf.num_attention_heads
    assert arch.tie_word_embeddings == hf.tie_word_embeddings
    assert arch.attention_bias == (variant == "qwen2")
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    scaling = hf.rope_parameters
    if scaling["rope_type"] == "default":
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling.rope_type == scaling["rope_type"]
        assert config.rope_scaling.factor == scaling["factor"]
    eos = hf.eos_token_id if isinstance(hf.eos_token_id, list) else [hf.eos_token_id]
    assert config.eos_token_ids == tuple(eos) == loaded.tokenizer.eos_token_ids

    weights = dict(loaded.weights)
    reference = _reference_weights(folder, hf.tie_word_embeddings)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), name


def test_weights_arrive_one_at_a_time_in_the_requested_dtype(folders):
    loaded = load_model_source(folders["llama3", True], dtype=torch.bfloat16)
    assert iter(loaded.weights) is loaded.weights
    name, tensor = next(loaded.weights)
    assert tensor.dtype == torch.bfloat16
    reference = _reference_weights(folders["llama3", True], tied=False)
    assert torch.equal(tensor, reference[name].to(torch.bfloat16))


def test_a_sliding_window_limits_attention_not_the_context(folders):
    # A window limits what each token attends to; the context stays the model's (512 here).
    arch = load_model_source(folders["mistral", False]).config.architecture
    assert arch.max_position_embeddings == 512
    assert arch.sliding_window == 256 and [arch.layer_window(i) for i in range(2)] == [256, 256]


def test_bundled_name_loads_the_bundled_gguf():
    config = load_model_source("smollm2-135m").config
    arch = config.architecture
    assert (arch.num_hidden_layers, arch.hidden_size, arch.num_attention_heads) == (30, 576, 9)
    assert (arch.num_key_value_heads, arch.head_dim, arch.vocab_size) == (3, 64, 49152)
    assert arch.tie_word_embeddings and config.rope_theta == 100000.0


@pytest.mark.slow
def test_bundled_gguf_weights_equal_transformers_own_gguf_conversion():
    """transformers dequantizes and un-permutes GGUF with its own code: an independent reference."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = bundled_model_path()
    raw = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(
            LlamaConfig(**{k: v for k, v in raw.items() if not k.startswith(("_", "model_"))})
        )
    reference = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    weights = dict(load_model_source(path).weights)
    assert weights.keys() == reference.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, torch.as_tensor(reference[name]).float()), name


@pytest.mark.parametrize("variant", ["smollm", "qwen2", "gqa"])
def test_gguf_from_a_hf_folder_loads_back_the_same_weights(folders, variant, tmp_path):
    """Q/K rows are permuted the way llama.cpp's converter does for llama and must come back in HF layout."""
    folder = folders[variant, False]
    loaded = load_model_source(build_tiny_gguf(folder, tmp_path / "tiny.gguf"))
    tied = variant == "smollm"
    assert loaded.config.architecture.tie_word_embeddings == tied
    assert loaded.config.architecture.attention_bias == (variant == "qwen2")
    weights = dict(loaded.weights)
    reference = _reference_weights(folder, tied)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), name


@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_0", "Q4_1", "F16", "BF16"])
def test_quantized_gguf_stays_close_to_the_original_weights(folders, ggml_type, tmp_path):
    folder = folders["gqa", False]
    weights = dict(load_model_source(build_tiny_gguf(folder, tmp_path / "q.gguf", ggml_type)).weights)
    reference = _reference_weights(folder, tied=False)
    # The quantization step of each format, relative to the weights' scale (std 0.2).
    tolerance = {"Q8_0": 0.01, "Q4_0": 0.2, "Q4_1": 0.12, "F16": 1e-3, "BF16": 1e-2}[ggml_type]
    for name, tensor in reference.items():
        assert (weights[name] - tensor).abs().max() <= tolerance * tensor.abs().max(), name


def test_unsupported_architecture_names_the_supported_ones(folders, tmp_path):
    folder = _copy(folders["llama2", False], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as error:
        load_model_source(folder)
    assert "GPT2LMHeadModel" in str(error.value) and "LlamaForCausalLM, MistralForCausalLM" in str(
        error.value
    )
    assert str(folder / "config.json") in str(error.value)


def test_missing_shard_is_named(folders, tmp_path):
    folder = _copy(folders["llama3", True], tmp_path)
    (folder / "model-00002-of-00004.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00002-of-00004.safetensors is missing"):
        load_model_source(folder)


def test_folder_without_weights_says_what_it_expected(folders, tmp_path):
    folder = _copy(folders["llama2", False], tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(
        ModelLoadError, match="has neither model.safetensors nor model.safetensors.index.json"
    ):
        load_model_source(folder)


@pytest.mark.parametrize("keep", [4, 100, -10])
def test_truncated_safetensors_is_named(folders, tmp_path, keep):
    folder = _copy(folders["llama2", False], tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep])
    with pytest.raises(ModelLoadError) as error:
        load_model_source(folder)
    assert f"{weights} is truncated" in str(error.value)


def test_missing_tensor_is_named(folders, tmp_path):
    folder = _copy(folders["qwen2", False], tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="has no tensor 'model.layers.1.self_attn.k_proj.bias'"):
        load_model_source(folder)


def test_shape_mismatch_names_tensor_and_both_shapes(folders, tmp_path):
    folder = _copy(folders["llama2", False], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as error:
        load_model_source(folder)
    assert "'model.layers.0.mlp.gate_proj.weight'" in str(error.value)
    assert "[128, 64]" in str(error.value) and "[96, 64]" in str(error.value)


def test_truncated_gguf_is_named(folders, tmp_path):
    path = build_tiny_gguf(folders["smollm", False], tmp_path / "tiny.gguf")
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(GGUFError, match=f"{path} is truncated"):
        load_model_source(path)


def _tiny_llama_gguf_with(folders, tmp_path, add) -> Path:
    """The gqa folder's GGUF file with what `add(writer)` writes besides."""
    import gguf

    source = gguf.GGUFReader(build_tiny_gguf(folders["gqa", False], tmp_path / "a.gguf"))
    writer = gguf.GGUFWriter(tmp_path / "b.gguf", "llama")
    for key, field in source.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            item_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=item_type)
    for tensor in source.tensors:
        writer.add_tensor(tensor.name, tensor.data)
    add(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path / "b.gguf"


def test_gguf_with_llama31_rope_factors_is_refused(folders, tmp_path):
    path = _tiny_llama_gguf_with(
        folders, tmp_path, lambda writer: writer.add_tensor("rope_freqs.weight", torch.ones(4).numpy())
    )
    with pytest.raises(ModelLoadError, match="per-frequency rope factors"):
        load_model_source(path)


def test_a_mixtral_gguf_is_refused_naming_what_to_load_instead(folders, tmp_path):
    # llama.cpp writes Mixtral as the llama architecture with an expert count.
    path = _tiny_llama_gguf_with(folders, tmp_path, lambda writer: writer.add_expert_count(8))
    with pytest.raises(ModelLoadError, match="mixture-of-experts llama model.*load the original folder"):
        load_model_source(path)


def test_path_that_is_no_model_is_refused(tmp_path):
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="neither a Hugging Face model folder nor a .gguf file"):
        load_model_source(stray)
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model_source(tmp_path)


def test_a_glm45_config_whose_experts_do_not_split_into_its_groups_is_refused(tmp_path):
    folder = build_tiny_model(tmp_path / "glm", "glm4_moe")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_group": 3}))
    with pytest.raises(ModelLoadError, match="8 experts do not split into 3 equal groups"):
        load_model_source(folder)
