"""The catalogue's DeepSeek and ERNIE entries read like their published config.json: the family's
own parser gives the same configuration from it, the published parameter counts come out, and the
operator sizes DeepSeek-V3 on 8 GPUs with the latent cache that absorbed attention holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES, MODELS
from pagoda_runtime.contract.sizing import GIB, fits, kv_bytes_for_context, kv_bytes_per_token, mtp_draft
from pagoda_runtime.executor.models.deepseek import config_from_hf

_YARN = {
    "type": "yarn",
    "factor": 40,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
}
_SHARED = {
    "hidden_act": "silu",
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "moe_layer_freq": 1,
}
# The fields of deepseek-ai/DeepSeek-V3's and DeepSeek-V2-Lite's config.json that the shape reads.
PUBLISHED = {
    "deepseek-v3": (
        "DeepseekV3ForCausalLM",
        {
            **_SHARED,
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_shared_experts": 1,
            "n_routed_experts": 256,
            "num_experts_per_tok": 8,
            "routed_scaling_factor": 2.5,
            "q_lora_rank": 1536,
            "topk_method": "noaux_tc",
            "n_group": 8,
            "topk_group": 4,
            "norm_topk_prob": True,
            "first_k_dense_replace": 3,
            "scoring_func": "sigmoid",
            "vocab_size": 129280,
            "rope_scaling": {**_YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
            "num_nextn_predict_layers": 1,
        },
        671.0,
    ),
    "deepseek-v2-lite": (
        "DeepseekV2ForCausalLM",
        {
            **_SHARED,
            "hidden_size": 2048,
            "intermediate_size": 10944,
            "moe_intermediate_size": 1408,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "n_shared_experts": 2,
            "n_routed_experts": 64,
            "num_experts_per_tok": 6,
            "routed_scaling_factor": 1.0,
            "q_lora_rank": None,
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "first_k_dense_replace": 1,
            "scoring_func": "softmax",
            "vocab_size": 102400,
            "rope_scaling": {**_YARN, "mscale": 0.707, "mscale_all_dim": 0.707},
        },
        15.7,
    ),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_deepseek_entry_is_what_its_config_json_parses_to(name):
    architecture, raw, billions = PUBLISHED[name]
    parsed = config_from_hf(raw, architecture)
    assert MODELS[name] == replace(parsed, bos_token_id=None, eos_token_ids=())
    assert round(KNOWN_ARCHITECTURES[name].num_parameters() / 1e9, 1) == billions


def test_deepseek_v3_on_eight_gpus_caches_its_latents_at_576_numbers_a_token_and_layer():
    v3 = KNOWN_ARCHITECTURES["deepseek-v3"]
    per_rank = v3.per_rank(8)
    assert kv_bytes_per_token(per_rank) == kv_bytes_per_token(v3) == 61 * (512 + 64) * 2
    # fp8 weights on 8 H200s leave each GPU room for a 128K context and more; every head's key and
    # value (16 heads of 2 x 192 a GPU) would have taken 10.7 times the cache.
    fit = fits(v3, "fp8", 131072, 141 * GIB, tensor_parallel_size=8)
    assert fit.fits
    naive = 61 * 2 * 16 * 192 * 2
    assert naive / kv_bytes_per_token(per_rank) == pytest.approx(10.67, abs=0.01)


def test_deepseek_v3s_mtp_module_is_the_14b_it_is_published_as():
    """DeepSeek-V3's README counts 685B parameters, 671B of the main model and 14B of its MTP
    module (both rounded): one mixture-of-experts layer, eh_proj and norms, its LM head, and an
    embedding (which the runtime borrows from the model, so the fit check leaves it out)."""
    v3 = KNOWN_ARCHITECTURES["deepseek-v3"]
    layer = mtp_draft(v3, "none")
    embedding = v3.vocab_size * v3.hidden_size
    assert layer.architecture.num_sparse_layers == 1
    module = layer.architecture.num_parameters() + layer.whole_parameters + embedding
    assert 13.0e9 < module < 14.5e9


@pytest.mark.parametrize(
    ("name", "architecture", "billions", "active"),
    [
        ("ernie-4.5-21b-a3b", "Ernie4_5_MoeForCausalLM", 21.8, 3.1),
        ("ernie-4.5-0.3b", "Ernie4_5ForCausalLM", 0.36, None),
    ],
)
def test_an_ernie_entry_is_what_its_config_parses_to(name, architecture, billions, active):
    """transformers' ERNIE 4.5 configs default to these two checkpoints' shapes (baidu's
    ERNIE-4.5-21B-A3B and -0.3B: 21B parameters of which 3B active, and 0.36B)."""
    from pagoda_runtime.executor.models.ernie import config_from_hf
    from transformers import Ernie4_5_MoeConfig, Ernie4_5Config

    config = (Ernie4_5_MoeConfig if active else Ernie4_5Config)().to_dict()
    parsed = config_from_hf(config, architecture)
    assert MODELS[name] == replace(parsed, bos_token_id=None, eos_token_ids=())
    arch = KNOWN_ARCHITECTURES[name]
    assert round(arch.num_parameters() / 1e9, 2 if active is None else 1) == billions
    if active:
        assert round(arch.active_linear_parameters() / 1e9, 1) == active


# moonshotai/Kimi-K2-Instruct's config.json: DeepSeek V3's architecture, 384 experts, 64 heads.
KIMI_K2 = {
    **_SHARED,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "routed_scaling_factor": 2.827,
    "q_lora_rank": 1536,
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "scoring_func": "sigmoid",
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "num_nextn_predict_layers": 0,
}


def test_kimi_k2_is_its_config_json_and_its_model_cards_1t_parameters_32b_activated():
    """The card's figures: 1T parameters, 32B activated (a token's experts, attention and LM head;
    the embedding is a lookup). In fp8 on 8 x 141 GB it fits with its whole 128K context."""
    parsed = config_from_hf(KIMI_K2, "DeepseekV3ForCausalLM")
    assert MODELS["kimi-k2"] == replace(parsed, bos_token_id=None, eos_token_ids=())
    k2 = KNOWN_ARCHITECTURES["kimi-k2"]
    assert round(k2.num_parameters() / 1e12, 1) == 1.0
    embedding = k2.vocab_size * k2.hidden_size
    activated = k2.active_linear_parameters() + k2.unquantized_parameters() - embedding
    assert round(activated / 1e9) == 32
    assert fits(k2, "fp8", 131072, 141 * GIB, tensor_parallel_size=8).fits


# The text_config of meta-llama's Llama-4-Scout-17B-16E-Instruct and Llama-4-Maverick-17B-128E-Instruct
# (the keys that shape the model; the rest are transformers' defaults).
LLAMA4_SCOUT = {
    "attention_chunk_size": 8192,
    "attn_scale": 0.1,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "head_dim": 128,
    "hidden_size": 5120,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760,
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {
        "factor": 16.0,
        "high_freq_factor": 1.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "use_qk_norm": True,
    "vocab_size": 202048,
}
LLAMA4_MAVERICK = {
    **LLAMA4_SCOUT,
    "interleave_moe_layer_step": 2,
    "max_position_embeddings": 1048576,
    "num_local_experts": 128,
    "rope_scaling": None,
    "use_qk_norm": False,
}


@pytest.mark.parametrize(
    ("name", "config", "billions"),
    [("llama-4-scout", LLAMA4_SCOUT, 108), ("llama-4-maverick", LLAMA4_MAVERICK, 401)],
)
def test_a_llama4_entry_is_its_text_config_and_17b_active(name, config, billions):
    """Meta's cards: Scout 109B and Maverick 400B parameters in all (their vision encoders
    included, which Pagoda does not load), 17B active a token as Meta counts them (attention, the
    routed and the shared expert or the dense MLP, the embedding and the LM head)."""
    from pagoda_runtime.executor.models.llama4 import config_from_hf
    from pagoda_runtime.loading.text_of_multimodal import text_config

    wrapped = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": config}
    parsed = config_from_hf(text_config(wrapped), "Llama4ForCausalLM")
    assert MODELS[name] == replace(parsed, bos_token_id=None, eos_token_ids=())
    arch = KNOWN_ARCHITECTURES[name]
    assert round(arch.num_parameters() / 1e9) == billions
    assert round((arch.active_linear_parameters() + arch.unquantized_parameters()) / 1e9) == 17
    # A chunked layer holds at most its chunk of keys: a 1M-token context caches 8192 tokens in 36
    # of the 48 layers.
    full = kv_bytes_for_context(replace(arch, layer_types=(), attention_chunk_size=None), 1 << 20)
    assert kv_bytes_for_context(arch, 1 << 20) == full // 4 + full * 3 // 4 * 8192 // (1 << 20)


def test_qwen15_moe_is_its_config_json_and_its_cards_14b_parameters_27b_activated():
    """transformers' Qwen2-MoE config defaults to Qwen1.5-MoE-A2.7B's shape; its config.json sets
    rope_theta 1e6 and an 8K context. The card: 14.3B parameters, 2.7B activated (the embedding and
    LM head included)."""
    from pagoda_runtime.executor.models.moe import qwen2_moe_config_from_hf
    from transformers import Qwen2MoeConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    raw = Qwen2MoeConfig().to_dict() | {"rope_parameters": rope, "max_position_embeddings": 8192}
    parsed = qwen2_moe_config_from_hf(raw, "Qwen2MoeForCausalLM")
    assert MODELS["qwen1.5-moe-a2.7b"] == replace(parsed, bos_token_id=None, eos_token_ids=())
    arch = KNOWN_ARCHITECTURES["qwen1.5-moe-a2.7b"]
    assert round(arch.num_parameters() / 1e9, 1) == 14.3
    assert round((arch.active_linear_parameters() + arch.unquantized_parameters()) / 1e9, 1) == 2.7
