"""Tiny random Hugging Face model folders, one per architecture variant the runtime supports.

`build_tiny_model(folder, variant)` writes config.json, generation_config.json, safetensors
weights (one file, or shards with model.safetensors.index.json when `sharded=True`) and a
tokenizer (tokenizer.json, tokenizer_config.json, chat template) trained on a small built-in
corpus, then returns the folder. Everything derives from a fixed seed, so the same call always
writes the same bytes, and it takes well under a second once transformers is imported.

Variants (see VARIANTS): "llama2" (multi-head attention, Metaspace BPE with byte fallback and a
BOS token), "llama3" (GQA, llama3 rope scaling, byte-level BPE with <|begin_of_text|>, two eos
ids), "llama_linear_rope" (linear rope scaling), "mistral" (GQA, sliding window),
"qwen2" (bias on q/k/v, ChatML, no BOS), "smollm" (tied embeddings, ChatML, no BOS) and "gqa"
(8 query heads sharing 2 key/value heads); and one per further family, each with its quirks on
(FAMILY_VARIANTS): "qwen3" (q/k norm, head_dim 32 on a 64-wide stream), "qwen3_window" (its last
layer a sliding window of 8), "qwen3_moe" (8 experts, 2 per token, renormalized, layer 1 dense),
"mixtral" (4 experts, 2 per token, tied embeddings), "mistral_window" (every layer a window of 8),
"gemma2" (window 8 on every other layer, attention and final soft-caps, query_pre_attn_scalar
24, tied), "gemma3" (q/k norm, window 8 then global, local RoPE base, linear scaling on the global
layers, untied), "phi3" (fused qkv and gate_up, LongRoPE past 64 positions, half the head
rotated), "glm4" (half of each head rotated in interleaved pairs, sandwich norms), "glm4_moe"
(grouped sigmoid routing with correction biases, a shared expert, q/k norms), "minimax_m2" (q/k
normed over all heads, half-rotated heads, sigmoid routing), "seed_oss" (q, k, v and o biases), "gpt_oss"
(attention sinks, biased experts whose clamp bites, window then full, YaRN), "deepseek_v3" (latent
attention with a low-rank query, interleaved rotary pairs, YaRN's mscale on the softmax, grouped
sigmoid routing), "deepseek_v2" (latent attention, scaled softmax routing), "deepseek_v2_grouped" (its
softmax routing limited to the best expert groups), "ernie4_5" and "ernie4_5_moe" (interleaved
rotary pairs; softmax routing chosen with a correction bias), "exaone4" (post-norms, a window,
a NoPE global layer), "llama4" (chunked attention, a NoPE layer with query temperature, top-1
sigmoid routing on the experts' input), "qwen2_moe" (a shared expert gated per token),
"granitemoe", "granitemoeshared", "granitemoehybrid" and "granite4_dense" (Granite's scalars around
fused experts, a shared MLP, NoPE), "olmoe" (wide q/k norms, unrenormalized experts), "dots1"
(per-head q/k norms, grouped sigmoid routing, a shared expert), "arcee" (an ungated relu² MLP),
"nemotron" (LayerNorm1P with biases, an ungated relu² MLP, half-rotated heads), "apertus" (per-head
q/k norms, an ungated xIELU MLP), and the others each
with its quirk noted beside it. The weights use a wide init and random norm weights and biases, so
greedy decoding is far from ties and a mis-loaded norm or bias changes the output.
Use the folder with `pagoda_runtime.loading.model_source.load_model_source(folder)` and, as the
reference, `transformers.AutoModelForCausalLM.from_pretrained(folder)`.

`build_tiny_gguf(hf_folder, path, ggml_type)` converts such a folder (byte-level tokenizer
variants: llama3 without its rope scaling, qwen2, smollm, gqa, and the families llama.cpp writes
built with tokenizer="chatml") to a GGUF file the way llama.cpp's converter does, Q/K rows
permuted for the llama architecture included, with the 2-D weights stored as F32, F16, BF16,
Q8_0, Q5_0, Q5_1, Q4_0 or Q4_1 (row length 64 fits the 32-element blocks), or, for a folder built
with rows of a multiple of 256 (`overrides`), as Q4_K, Q5_K, or llama.cpp's mixes Q4_K_M, Q5_K_M
and Q6_K (MIXES: each tensor, merged experts included, in the type llama-quantize gives it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    ApertusConfig,
    ArceeConfig,
    AutoModelForCausalLM,
    Cohere2Config,
    CohereConfig,
    DeepseekV2Config,
    DeepseekV3Config,
    Dots1Config,
    Ernie4_5_MoeConfig,
    Ernie4_5Config,
    Exaone4Config,
    Gemma2Config,
    Gemma3TextConfig,
    Glm4Config,
    Glm4MoeConfig,
    GptOssConfig,
    GraniteConfig,
    GraniteMoeConfig,
    GraniteMoeHybridConfig,
    GraniteMoeSharedConfig,
    Lfm2Config,
    Llama4TextConfig,
    LlamaConfig,
    MiniMaxM2Config,
    MistralConfig,
    MixtralConfig,
    NemotronConfig,
    NemotronHConfig,
    Olmo2Config,
    Olmo3Config,
    OlmoeConfig,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    SeedOssConfig,
    SmolLM3Config,
)

from tests.runtime.k_quants import K_QUANTIZERS

SEED = 1234
BIAS_STD = 0.1

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 -7",
    "Café naïve résumé — déjà vu, Straße, Ærø, smørrebrød.",
    "日本語のテキストと中文文本 한국어 텍스트",
    "Emoji: 😀 🎉 👍🏽 🇫🇷 ❤️ 🚀",
    "   leading spaces, trailing spaces   and   runs of    whitespace\n\n\n",
    'JSON: {"key": [1, 2, 3], "nested": {"ok": true, "none": null}}',
    "Once upon a time there was a little model that learned to talk.",
    "She sells sea shells by the sea shore; the shells she sells are sea shells.",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role']"
    " + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA2_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] '"
    " + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)

_SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    initializer_range=0.2,
)

_GRANITE_SCALARS = {
    "embedding_multiplier": 3.0,
    "attention_multiplier": 0.3,
    "residual_multiplier": 0.4,
    "logits_scaling": 2.5,
}

# variant -> (config class, tokenizer style, extra config fields)
VARIANTS: dict[str, tuple[type, str, dict]] = {
    "llama2": (LlamaConfig, "metaspace", {"num_key_value_heads": 4}),
    "llama3": (
        LlamaConfig,
        "llama3",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama_linear_rope": (LlamaConfig, "metaspace", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "mistral": (MistralConfig, "metaspace", {"sliding_window": 256}),
    "qwen2": (Qwen2Config, "chatml", {"rope_theta": 1000000.0}),
    "smollm": (LlamaConfig, "chatml", {"tie_word_embeddings": True, "num_attention_heads": 8}),
    "gqa": (LlamaConfig, "chatml", {"num_attention_heads": 8, "num_key_value_heads": 2}),
}

# Windows of 8 tokens are shorter than most prompts, so blocks fall behind them in every test.
_WINDOW = 8
_PHI3_HALF_ROTARY = 8  # of head_dim 16: LongRoPE's factors are per rotated frequency
_MLA_SIZES = dict(
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, moe_intermediate_size=32
)
# DeepSeek V2's latent attention without the low-rank query, 8 experts of which 2 per token, 2 shared.
_DEEPSEEK_V2 = dict(
    num_key_value_heads=4,
    q_lora_rank=None,
    **_MLA_SIZES,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=2,
    first_k_dense_replace=1,
    routed_scaling_factor=1.5,
    pad_token_id=None,
)
FAMILY_VARIANTS: dict[str, tuple[type, str, dict]] = {
    "qwen3": (Qwen3Config, "chatml", {"head_dim": 32, "rope_theta": 1000000.0}),
    "qwen3_window": (
        Qwen3Config,
        "chatml",
        {"use_sliding_window": True, "sliding_window": _WINDOW, "max_window_layers": 1},
    ),
    "qwen3_moe": (
        Qwen3MoeConfig,
        "chatml",
        {
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
            "head_dim": 16,
        },
    ),
    "mixtral": (
        MixtralConfig,
        "metaspace",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": True},
    ),
    "mistral_window": (MistralConfig, "metaspace", {"sliding_window": _WINDOW}),
    "gemma2": (
        Gemma2Config,
        "metaspace",
        {
            "head_dim": 16,
            "sliding_window": _WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    "gemma3": (
        Gemma3TextConfig,
        "metaspace",
        {
            "head_dim": 16,
            "sliding_window": _WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    ),
    # Every scalar away from 1, so that a model ignoring one of them fails.
    "granite": (GraniteConfig, "chatml", {**_GRANITE_SCALARS, "tie_word_embeddings": True}),
    # The second of the two layers attends without rotary embeddings (SmolLM3's every fourth).
    "smollm3": (
        SmolLM3Config,
        "chatml",
        {"no_rope_layers": [1, 0], "rope_theta": 2000000.0, "pad_token_id": None},
    ),
    "olmo2": (Olmo2Config, "chatml", {}),
    "olmo3": (
        Olmo3Config,
        "chatml",
        {
            "sliding_window": _WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            # As OLMo 3's long-context checkpoints: YaRN on the full layers, plain RoPE on the others.
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 16,
                    "rope_theta": 500000.0,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
            },
        },
    ),
    "cohere": (CohereConfig, "chatml", {"logit_scale": 0.25}),
    "cohere2": (
        Cohere2Config,
        "chatml",
        {
            "logit_scale": 0.25,
            "sliding_window": _WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    # Half of each head rotated, in interleaved pairs; norms before and after attention and the MLP.
    "glm4": (Glm4Config, "chatml", {"head_dim": 16, "partial_rotary_factor": 0.5, "pad_token_id": None}),
    # Sigmoid routing over 2 groups of 4 experts with random correction biases (build_tiny_model),
    # a shared expert, the first layer dense, per-head q/k norms (GLM-4.6), half of each head rotated.
    "glm4_moe": (
        Glm4MoeConfig,
        "chatml",
        {
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            "use_qk_norm": True,
            "pad_token_id": None,
        },
    ),
    # Biases on q, k and v and, by its own flag, on o.
    "seed_oss": (SeedOssConfig, "chatml", {"head_dim": 16, "attention_out_bias": True, "pad_token_id": None}),
    # q and k normed over all heads, half of each head rotated, sigmoid routing with correction biases.
    "minimax_m2": (
        MiniMaxM2Config,
        "chatml",
        {
            "intermediate_size": 32,
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "partial_rotary_factor": 0.5,
            },
        },
    ),
    # Experts' gate_up drawn wide (build_tiny_model) so that their clamp at 7 bites, sinks around 1 so
    # that they take a real share of the softmax, windows on the first layer, YaRN on both.
    "gpt_oss": (
        GptOssConfig,
        "chatml",
        {
            "intermediate_size": 32,
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": _WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 128,
                "rope_theta": 150000.0,
            },
        },
    ),
    # Multi-head latent attention with a low-rank query, interleaved rotary pairs and YaRN whose
    # mscale_all_dim scales the softmax; sigmoid routing over 2 groups of 4 experts, a shared
    # expert, the first layer dense.
    "deepseek_v3": (
        DeepseekV3Config,
        "chatml",
        {
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            **_MLA_SIZES,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            "rope_interleave": True,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "rope_theta": 10000.0,
            },
            "pad_token_id": None,
        },
    ),
    # Latent attention without the low-rank query; softmax routing whose sum routed_scaling_factor
    # scales, 2 shared experts; a norm epsilon far from the low-rank norms' fixed 1e-6.
    "deepseek_v2": (
        DeepseekV2Config,
        "chatml",
        {**_DEEPSEEK_V2, "topk_method": "greedy", "rms_norm_eps": 1e-2},
    ),
    # DeepSeek-V2 and V2.5's group_limited_greedy: the softmax's top 2 within the better of 2 expert
    # groups (the one whose best expert scores highest), so that the second-best expert is passed over
    # whenever the other group holds it.
    "deepseek_v2_grouped": (
        DeepseekV2Config,
        "chatml",
        {**_DEEPSEEK_V2, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
    ),
    # Interleaved rotary pairs, heads wider than hidden_size / heads.
    "ernie4_5": (Ernie4_5Config, "chatml", {"head_dim": 32}),
    # Softmax routing whose choice a random correction bias moves (the weights stay the softmax's),
    # a shared expert, layer 0 dense.
    "ernie4_5_moe": (
        Ernie4_5_MoeConfig,
        "chatml",
        {
            "head_dim": 16,
            "moe_num_experts": 8,
            "moe_k": 2,
            "moe_intermediate_size": 32,
            "moe_num_shared_experts": 1,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": 1,
        },
    ),
    # Norms after attention and the MLP, per-head q/k norms, a window of 8 on layer 0 and layer 1
    # global without rotary embeddings.
    "exaone4": (Exaone4Config, "chatml", {"sliding_window": _WINDOW, "sliding_window_pattern": 2}),
    # Qwen2's biased attention, softmax top 2 of 8 experts unrenormalized, a shared expert whose
    # sigmoid gate varies by token, layer 1 dense.
    "qwen2_moe": (
        Qwen2MoeConfig,
        "chatml",
        {
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "mlp_only_layers": [1],
        },
    ),
    # Layer 0 rotates (interleaved pairs, llama3 scaling with equal frequency factors as Scout's)
    # and attends within chunks of 8, its q and k normed without weights, and has a dense MLP;
    # layer 1 attends to everything without rotation, its queries scaled from position 3 on, and
    # routes each token to one of 4 experts, its input scaled by the router's sigmoid, beside a
    # shared expert.
    "llama4": (
        Llama4TextConfig,
        "chatml",
        {
            "no_rope_layers": [1, 0],
            "head_dim": 16,
            "intermediate_size": 32,
            "intermediate_size_mlp": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2,
            "attention_chunk_size": _WINDOW,
            "floor_scale": 4,
            "attn_scale": 0.5,
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 500000.0,
            },
        },
    ),
    # Granite's scalars away from 1 around 6 experts, 2 per token (granite-3.x-moe); with a shared
    # MLP beside them; Granite 4 with every layer attending, its experts and shared MLP (rotary
    # embeddings on), and its dense form (the shared MLP alone, no rotary embeddings).
    "granitemoe": (
        GraniteMoeConfig,
        "chatml",
        {**_GRANITE_SCALARS, "num_local_experts": 6, "num_experts_per_tok": 2},
    ),
    "granitemoeshared": (
        GraniteMoeSharedConfig,
        "chatml",
        {
            **_GRANITE_SCALARS,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
        },
    ),
    "granitemoehybrid": (
        GraniteMoeHybridConfig,
        "chatml",
        {
            **_GRANITE_SCALARS,
            "layer_types": ["attention", "attention"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
            "position_embedding_type": "rope",
        },
    ),
    "granite4_dense": (
        GraniteMoeHybridConfig,
        "chatml",
        {
            **_GRANITE_SCALARS,
            "layer_types": ["attention", "attention"],
            "num_local_experts": 0,
            "shared_intermediate_size": 96,
            "position_embedding_type": "nope",
        },
    ),
    # An ungated relu² MLP on the Llama layout.
    "arcee": (ArceeConfig, "chatml", {}),
    # Per-head q/k norms, Apertus' norm names, an ungated MLP with xIELU's learned parameters.
    "apertus": (ApertusConfig, "chatml", {"head_dim": 16}),
    # LayerNorms with a bias whose weight is stored less one, an ungated relu² MLP, half of each
    # head rotated.
    "nemotron": (NemotronConfig, "chatml", {"partial_rotary_factor": 0.5}),
    # OLMoE: q and k normed over all heads, softmax top 2 of 8 experts left unrenormalized.
    "olmoe": (OlmoeConfig, "chatml", {"num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32}),
    # dots.llm1: per-head q/k norms, layer 0 dense, then sigmoid routing with a correction bias
    # beside a shared expert (the scaling and groups as glm4_moe's and deepseek_v3's).
    "dots1": (
        Dots1Config,
        "chatml",
        {
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 1.0,
        },
    ),
    "phi3": (
        Phi3Config,
        "chatml",
        {
            "pad_token_id": 0,
            "original_max_position_embeddings": 64,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "original_max_position_embeddings": 64,
                "short_factor": [1.0 + 0.1 * i for i in range(_PHI3_HALF_ROTARY // 2)],
                "long_factor": [1.5 + 0.5 * i for i in range(_PHI3_HALF_ROTARY // 2)],
            },
        },
    ),
}
VARIANTS.update(FAMILY_VARIANTS)

# Qwen3.5's and Qwen3-Next's layers: two DeltaNet key heads shared by four value heads, around one
# gated attention layer.
_DELTANET_LAYERS = {
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}

# Hybrid models, recurrent layers (Mamba-2, gated DeltaNet, short convolutions) beside attention:
# apart from VARIANTS, whose tests assume every layer keeps KV (prefix caching);
# tests/runtime/engine/test_hybrid_models.py has theirs. Granite 4.0-H's layout: NoPE attention,
# experts beside a shared MLP; two groups of heads and transformers' scan in chunks of 8 tokens, so
# that a prompt spans several.
HYBRID_VARIANTS: dict[str, tuple[type, str, dict]] = {
    "granite4_hybrid": (
        GraniteMoeHybridConfig,
        "chatml",
        {
            **_GRANITE_SCALARS,
            "num_hidden_layers": 3,
            "layer_types": ["mamba", "attention", "mamba"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
            "position_embedding_type": "nope",
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_d_state": 16,
            "mamba_n_groups": 2,
            "mamba_d_conv": 4,
            "mamba_chunk_size": 8,
        },
    ),
    # Qwen3.5's language model: gated DeltaNet layers (two key heads shared by four value heads)
    # around gated attention with RoPE on a quarter of each head; its three multimodal rotary
    # sections, which text positions make the plain rotation.
    "qwen3_5": (
        Qwen3_5TextConfig,
        "chatml",
        {
            **_DELTANET_LAYERS,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        },
    ),
    # Qwen3-Next: the same layers, its input projections fused per key head, experts beside a
    # gated shared expert.
    "qwen3_next": (
        Qwen3NextConfig,
        "chatml",
        {
            **_DELTANET_LAYERS,
            "partial_rotary_factor": 0.25,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "norm_topk_prob": True,
        },
    ),
    # LFM2: gated short convolutions around attention with per-head q/k norms; its MLP width rule
    # (two thirds of block_ff_dim, rounded up to a multiple of 32 here: 96).
    "lfm2": (
        Lfm2Config,
        "chatml",
        {
            "num_hidden_layers": 3,
            "layer_types": ["conv", "full_attention", "conv"],
            "conv_L_cache": 3,
            "block_multiple_of": 32,
            "tie_word_embeddings": True,
        },
    ),
    # Nemotron-H's layers: Mamba-2, attention without RoPE, and relu² MLPs apart; four groups of
    # heads. time_step_min is transformers' floor of the scan's time step, which NVIDIA's own model
    # (and Pagoda) does not apply: set below any step the tiny model takes.
    "nemotron_h": (
        NemotronHConfig,
        "chatml",
        {
            "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
            "head_dim": 16,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 4,
            "conv_kernel": 4,
            "chunk_size": 8,
            "time_step_min": 1e-9,
            "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": False,
        },
    ),
}

# style -> (special tokens, bos, eos tokens, adds bos, chat template)
_TOKENIZER_STYLES = {
    "metaspace": (["<unk>", "<s>", "</s>"], "<s>", ["</s>"], True, LLAMA2_TEMPLATE),
    "llama3": (
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        ["<|end_of_text|>", "<|eot_id|>"],
        True,
        LLAMA3_TEMPLATE,
    ),
    "chatml": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        None,
        ["<|im_end|>", "<|endoftext|>"],
        False,
        CHATML_TEMPLATE,
    ),
}


def _byte_level_tokenizer(specials: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def _metaspace_tokenizer(specials: list[str]) -> Tokenizer:
    """Llama-2 / Mistral style: '▁' marks spaces, unknown characters fall back to <0xNN> byte tokens."""
    pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    draft = Tokenizer(models.BPE())
    draft.pre_tokenizer = pre
    draft.train_from_iterator(_CORPUS[:6], trainers.BpeTrainer(vocab_size=200, show_progress=False))
    trained = json.loads(draft.to_str())["model"]
    vocab = {token: i for i, token in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for token in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(specials)
    return tokenizer


def _save_tokenizer(folder: Path, style: str) -> tuple[int, int | None, list[int]]:
    specials, bos, eos, adds_bos, template = _TOKENIZER_STYLES[style]
    tokenizer = _metaspace_tokenizer(specials) if style == "metaspace" else _byte_level_tokenizer(specials)
    if adds_bos:
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos[0],
        unk_token="<unk>" if style == "metaspace" else None,
        chat_template=template,
        add_bos_token=adds_bos,
    )
    fast.save_pretrained(folder)
    bos_id = tokenizer.token_to_id(bos) if bos else None
    return tokenizer.get_vocab_size(), bos_id, [tokenizer.token_to_id(t) for t in eos]


def build_tiny_model(
    folder: str | Path,
    variant: str,
    *,
    sharded: bool = False,
    dtype: torch.dtype = torch.float32,
    overrides: dict | None = None,
    tokenizer: str | None = None,
) -> Path:
    """overrides: config fields beyond the variant's (K-quant GGUF files need rows of a multiple of
    256 weights); tokenizer: a style other than the variant's
    ("chatml" for a byte-level tokenizer a GGUF file can carry)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_class, style, extra = {**VARIANTS, **HYBRID_VARIANTS}[variant]
    style = tokenizer or style
    extra = {**extra, **(overrides or {})}
    tokenizer_vocab, bos_id, eos_ids = _save_tokenizer(folder, style)
    # Real checkpoints pad the embedding past the tokenizer's vocabulary; so do these.
    vocab_size = -(-tokenizer_vocab // 64) * 64
    config = config_class(
        **{**_SIZES, **extra},
        vocab_size=vocab_size,
        bos_token_id=bos_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.normal_(1.0, 0.2)
            elif name.endswith("e_score_correction_bias"):
                # ERNIE's (a parameter, the others' a buffer): as large as the scores' spread, so that
                # it changes which experts win.
                parameter.normal_(0.0, 0.5)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.2)
            elif name.endswith(("gate.weight", "router.weight")):
                parameter.normal_(0.0, 1.0)  # routers far from ties between experts
            elif variant == "gpt_oss" and name.endswith("experts.gate_up_proj"):
                parameter.normal_(0.0, 0.5)
            elif name.endswith("sinks"):
                parameter.normal_(1.0, 1.0)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.5)  # biases that change which experts are chosen
    model.save_pretrained(folder, max_shard_size=150_000 if sharded else "10GB")
    return folder


def build_target_and_near_draft(root: str | Path) -> tuple[Path, Path]:
    """A tiny target and a draft model for it: the target's tokenizer and weights with another norm
    epsilon, so that the target accepts about half its drafts (an unrelated random model's drafts
    are all but never accepted). smollm: 8 query heads and 2 KV heads, which split over 2 ranks."""
    root = Path(root)
    target = build_tiny_model(root / "target", "smollm")
    return target, build_tiny_model(root / "near", "smollm", overrides={"rms_norm_eps": 0.01})


_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _add_gguf_tensor(writer, name: str, data: np.ndarray, stored: str) -> None:
    """`data` written as the block type `stored` (a GGMLQuantizationType name); vectors as F32."""
    import gguf

    quantized = gguf.GGMLQuantizationType[stored]
    if data.ndim >= 2 and stored in K_QUANTIZERS:
        # Merged experts [E, N, K] are E * N rows of blocks.
        blocks = K_QUANTIZERS[stored](data.reshape(-1, data.shape[-1]))
        writer.add_tensor(name, blocks.reshape(*data.shape[:-1], -1), raw_dtype=quantized)
    elif data.ndim >= 2 and stored != "F32":
        writer.add_tensor(name, gguf.quants.quantize(data, quantized), raw_dtype=quantized)
    else:
        writer.add_tensor(name, data)


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, verbatim in effect."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _k_mix(main: str, more: str, qkv: str, eight_experts_output: str | None = None):
    """llama.cpp's K-quant mixes (llama-quant.cpp's llama_tensor_get_type) for the tensors these
    files hold: the LM head (or a tied embedding) in `more`; attn_v and ffn_down, a layer's merged
    experts' included, in `more` in the layers use_more_bits picks; a fused attn_qkv in `qkv`; and,
    in a model of exactly 8 experts, attn_k and attn_v in Q8_0 and attn_output in
    `eight_experts_output`. Every other 2-D tensor in `main`."""

    def type_of(gguf_name: str, layers: int, experts: int, tied: bool) -> str:
        if gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight"):
            return more
        if not gguf_name.startswith("blk."):
            return main
        layer, name = int(gguf_name.split(".")[1]), gguf_name.split(".", 2)[2]
        if experts == 8 and name in ("attn_k.weight", "attn_v.weight"):
            return "Q8_0"
        if experts == 8 and name == "attn_output.weight" and eight_experts_output:
            return eight_experts_output
        if name == "attn_qkv.weight":
            return qkv
        if name in ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight") and _more_bits(layer, layers):
            return more
        return main

    return type_of


MIXES = {
    "Q4_K_M": _k_mix("Q4_K", "Q6_K", "Q5_K", "Q5_K"),
    "Q5_K_M": _k_mix("Q5_K", "Q6_K", "Q6_K"),
    "Q6_K": _k_mix("Q6_K", "Q6_K", "Q6_K"),
}


_GGUF_ARCHES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gemma2": "gemma2"}
_GGUF_ARCHES |= {"gemma3_text": "gemma3", "phi3": "phi3"}
# Hugging Face names of the families' own tensors -> llama.cpp's.
_GGUF_FAMILY_NAMES = {
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}
_GGUF_GEMMA_NORMS = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _gguf_family_metadata(writer, config: dict, arch: str) -> None:
    """What llama.cpp's converter writes for each family beyond the Llama keys."""
    import gguf

    if "head_dim" in config and config["head_dim"]:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch == "qwen3moe":
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(config["sliding_window"])
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch == "gemma3":
        full = config["rope_parameters"]["full_attention"]
        if full.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(full["factor"])
    if arch == "phi3":
        rope = config["rope_parameters"]
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        writer.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))


def _rope_theta(config: dict) -> float:
    rope = config["rope_parameters"]
    return rope.get("full_attention", rope)["rope_theta"]


def build_tiny_gguf(hf_folder: str | Path, path: str | Path, ggml_type: str = "F32") -> Path:
    """Also the families llama.cpp writes: qwen3, qwen3moe (experts merged into one tensor per
    projection and layer), gemma2 and gemma3 (norm weights plus one, the window pattern as flags)
    and phi3 (fused qkv and gate_up, LongRoPE's factors as tensors)."""
    import gguf  # only here: the tiny Hugging Face folders need no gguf installed

    hf_folder, path = Path(hf_folder), Path(path)
    config = json.loads((hf_folder / "config.json").read_text())
    arch = _GGUF_ARCHES.get(config["model_type"], "llama")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    if arch != "phi3":
        writer.add_rope_dimension_count(
            config["head_dim"] if config.get("head_dim") else config["hidden_size"] // heads
        )
    _gguf_family_metadata(writer, config, arch)

    tokenizer = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer["added_tokens"]}}
    special = {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = [f"[PAD{i}]" for i in range(config["vocab_size"])]
    for token, i in vocab.items():
        tokens[i] = token
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 5 if i >= len(vocab) else 1 for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    eos = config["eos_token_id"]
    writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    writer.add_add_bos_token(tokenizer.get("post_processor") is not None)
    writer.add_chat_template((hf_folder / "chat_template.jinja").read_text())

    layer_names = _GGUF_LAYER_NAMES | _GGUF_FAMILY_NAMES | (_GGUF_GEMMA_NORMS if "gemma" in arch else {})
    experts: dict[str, dict[int, np.ndarray]] = {}
    tensors = _hf_tensors(hf_folder)
    mix = MIXES.get(ggml_type)
    layers, num_experts = config["num_hidden_layers"], config.get("num_local_experts", 0)
    tied = "lm_head.weight" not in tensors

    def stored(gguf_name: str) -> str:
        return mix(gguf_name, layers, num_experts, tied) if mix else ggml_type

    for name, tensor in tensors.items():
        data = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            gguf_name = "output.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            if rest.startswith("mlp.experts."):
                expert, proj = rest.removeprefix("mlp.experts.").split(".", 1)
                short = {"gate_proj.weight": "gate", "up_proj.weight": "up", "down_proj.weight": "down"}[proj]
                experts.setdefault(f"blk.{layer}.ffn_{short}_exps.weight", {})[int(expert)] = data
                continue
            gguf_name = f"blk.{layer}.{layer_names[rest]}"
            if arch == "llama" and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                data = _llama_cpp_permute(data, heads if "q_proj" in rest else kv_heads)
        if "gemma" in arch and name.endswith("norm.weight"):
            data = data + 1
        _add_gguf_tensor(writer, gguf_name, data, stored(gguf_name))
    for gguf_name, by_expert in experts.items():
        merged = np.stack([by_expert[e] for e in sorted(by_expert)])
        _add_gguf_tensor(writer, gguf_name, merged, stored(gguf_name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def whole_prompt_overrides(variant: str, context: int = 512) -> dict | None:
    """Config overrides under which sequences of up to `context` tokens compare with transformers:
    Phi-3's LongRoPE switches to its long factors per position past its original context, while
    transformers recomputes the whole sequence with them (kernels/rope_cache.py), so the original
    context is raised."""
    if variant != "phi3":
        return None
    rope = {**FAMILY_VARIANTS["phi3"][2]["rope_parameters"], "original_max_position_embeddings": context}
    return {"original_max_position_embeddings": context, "rope_parameters": rope}
