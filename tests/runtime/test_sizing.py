"""Memory sizing: parameter counts match the published models, bytes per format, and fits()."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.sizing import (
    GGUF_BLOCK_FORMATS,
    GIB,
    WeightFormat,
    check_tensor_parallel,
    decode_weight_bytes,
    fits,
    gguf_block_type,
    kv_bytes_for_context,
    kv_bytes_per_block,
    kv_bytes_per_token,
    kv_pools,
    weight_bytes,
    window_blocks_needed,
)

# Parameter counts from the models' safetensors metadata on the Hugging Face Hub.
PUBLISHED_PARAMETERS = {
    "llama-3-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_248_023_552,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
}


@pytest.mark.parametrize("family", sorted(PUBLISHED_PARAMETERS))
def test_known_families_have_the_published_parameter_count(family):
    assert KNOWN_ARCHITECTURES[family].num_parameters() == PUBLISHED_PARAMETERS[family]


def test_smollm2_family_matches_the_bundled_gguf_metadata():
    gguf = pytest.importorskip("gguf")
    from pagoda_runtime.contract.bundled import resolve_model

    reader = gguf.GGUFReader(resolve_model("smollm2-135m"))

    def field(key):
        return reader.fields[key].contents()

    arch = KNOWN_ARCHITECTURES["smollm2-135m"]
    assert field("llama.block_count") == arch.num_hidden_layers
    assert field("llama.embedding_length") == arch.hidden_size
    assert field("llama.feed_forward_length") == arch.intermediate_size
    assert field("llama.attention.head_count") == arch.num_attention_heads
    assert field("llama.attention.head_count_kv") == arch.num_key_value_heads
    assert field("llama.context_length") == arch.max_position_embeddings
    assert len(field("tokenizer.ggml.tokens")) == arch.vocab_size


def test_bf16_weights_take_two_bytes_per_parameter():
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    assert weight_bytes(arch, "none") == weight_bytes(arch, "bf16") == 2 * arch.num_parameters()
    assert weight_bytes(arch, "fp16") == 2 * arch.num_parameters()


def _linear_parameters(arch):
    return sum(o * i * n for o, i, n in arch.linear_shapes())


def test_quantized_formats_shrink_only_the_linear_layers_by_their_bit_width():
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    linear = _linear_parameters(arch)
    kept = 2 * arch.unquantized_parameters()
    # int4 group 128, asymmetric: 4 bits plus an fp16 scale and an fp16 zero per 128 weights.
    assert weight_bytes(arch, "int4") == kept + linear * (0.5 + 4 / 128)
    # AWQ and GPTQ are held in that same layout once loaded.
    assert weight_bytes(arch, "awq") == weight_bytes(arch, "gptq") == weight_bytes(arch, "int4")
    # GGUF Q4_0/Q4_1: groups of 32 instead of 128.
    assert weight_bytes(arch, "gguf") == kept + linear * (0.5 + 4 / 32)
    assert weight_bytes(arch, "gguf", gguf_block="Q4_0") == weight_bytes(arch, "gguf")
    # Q8_0: 8 bits plus an fp16 scale per 32.
    assert weight_bytes(arch, "gguf", gguf_block="Q8_0") == kept + linear * (1 + 2 / 32)
    int8 = weight_bytes(arch, "int8")
    assert kept + linear < int8 < kept + linear * 1.001  # a scale per output row is small
    assert weight_bytes(arch, "fp8") > int8  # float32 scales
    assert weight_bytes(arch, "int4") < int8 < weight_bytes(arch, "none")


def test_int4_groups_shrink_to_divide_a_narrow_layer():
    arch = KNOWN_ARCHITECTURES["smollm2-135m"]  # 576 inputs: groups of 64; 1536 inputs: groups of 128
    linear = sum(
        (o * i / 2 + o * (i // (64 if i == 576 else 128)) * 4) * n for o, i, n in arch.linear_shapes()
    )
    assert weight_bytes(arch, "int4") == 2 * arch.unquantized_parameters() + linear


def test_float32_models_take_four_bytes_per_parameter():
    arch = KNOWN_ARCHITECTURES["smollm2-135m"]
    assert weight_bytes(arch, "none", "float32") == 4 * arch.num_parameters()
    int8 = weight_bytes(arch, "int8", "float32")
    assert int8 - weight_bytes(arch, "int8") == 2 * arch.unquantized_parameters()


def test_kv_cache_of_llama3_8b_is_128_kib_per_token():
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    per_token = kv_bytes_per_token(arch)
    assert per_token == 128 * 1024
    assert kv_bytes_per_token(arch, "fp8") == per_token // 2
    assert kv_bytes_per_block(arch, 16) == 16 * per_token
    # A rank's cache holds its slice: 8 KV heads over 4 ranks leave 2 on each.
    assert kv_bytes_per_token(arch.per_rank(4)) == per_token // 4


def test_llama3_70b_bf16_does_not_fit_one_h100_but_int4_does():
    arch = KNOWN_ARCHITECTURES["llama-3-70b"]
    bf16 = fits(arch, "none", 8192, 80 * GIB)
    int4 = fits(arch, "int4", 8192, 80 * GIB)
    assert not bf16.fits and int4.fits
    assert bf16.required_bytes == bf16.weight_bytes + bf16.kv_bytes + bf16.overhead_bytes
    assert "does not fit in 80.0 GiB" in bf16.describe()
    assert f"{bf16.weight_bytes / GIB:.1f} GiB" in bf16.describe()


def test_a_longer_context_needs_more_kv_memory():
    arch = KNOWN_ARCHITECTURES["llama-3.1-8b"]
    short, long = fits(arch, "none", 8192, 24 * GIB), fits(arch, "none", 131072, 24 * GIB)
    assert long.kv_bytes == 16 * short.kv_bytes
    assert short.fits and not long.fits


def test_unknown_names_are_refused_with_the_choices():
    arch = KNOWN_ARCHITECTURES["smollm2-135m"]
    with pytest.raises(ValueError, match="unknown quantization 'int3'.*int4"):
        weight_bytes(arch, "int3")
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        kv_bytes_per_token(arch, "int2")


def test_a_gguf_sources_block_type_comes_from_its_file_name():
    assert gguf_block_type("file:///m/Meta-Llama-3-8B.Q8_0.gguf") == "Q8_0"
    assert gguf_block_type("pvc://models/llama/Llama-3-8B-q4_0.gguf") == "Q4_0"
    assert gguf_block_type("bundled://smollm2-135m") == "Q4_1"
    assert gguf_block_type("pvc://models/bartowski/Llama-3.1-8B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert gguf_block_type("s3://models/qwen2.5-7b-instruct-q5_k_m.gguf") == "Q5_K_M"
    assert gguf_block_type("pvc://m/Qwen3-8B-Q6_K.gguf") == "Q6_K"
    assert gguf_block_type("pvc://m/gemma-2-9b-it-f16.gguf") == "F16"
    # Unnamed, or a type sizing does not know: sized as dequantized, the most a file can take.
    for source in ("file:///m/x.gguf", "file:///m/llama-Q4_0_4_4.gguf", "file:///m/m-UD-Q4_K_XL.gguf"):
        assert gguf_block_type(source) == "F16"


def _llama_cpp_q4_k_m_linear_bytes(arch):
    """The projections of llama.cpp's Q4_K_M of a dense model below 70B as Pagoda holds them: attn_v
    and ffn_down Q6_K in the layers use_more_bits picks (first and last eighth, every third between),
    every other projection Q4_K."""
    n = arch.num_hidden_layers
    wider = [i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2 for i in range(n)]
    names = ["q", "k", "v", "o", "gate", "up", "down"]
    return sum(
        GGUF_BLOCK_FORMATS["Q6_K" if name in ("v", "down") and wider[layer] else "Q4_K"].linear_bytes(
            out, inp
        )
        for layer in range(n)
        for name, (out, inp, _) in zip(names, arch.linear_shapes(), strict=True)
    )


@pytest.mark.parametrize("family", ["llama-3-8b", "llama-3.2-1b", "qwen2.5-7b", "smollm2-135m"])
def test_q4_k_m_files_are_never_sized_below_what_they_occupy_as_served(family):
    arch = KNOWN_ARCHITECTURES[family]
    served = 2 * arch.unquantized_parameters() + _llama_cpp_q4_k_m_linear_bytes(arch)
    sized = weight_bytes(arch, "gguf", gguf_block="Q4_K_M")
    # Over by attn_v, bounded at dequantized bf16 for the layers a 70B model gives Q5_K.
    assert served <= sized < served * 1.035


def test_k_quant_and_legacy_files_take_the_bits_of_their_packed_layout():
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    linear = _linear_parameters(arch)
    kept = 2 * arch.unquantized_parameters()
    assert weight_bytes(arch, "gguf", gguf_block="Q6_K") == kept + linear * (1 + 2 / 16)  # int8, groups of 16
    # Q5_0 is held like Q8_0, but with an importance matrix ffn_down of the first 4 of 32 layers is Q5_1,
    # which has no packed layout: bf16 there.
    down = arch.hidden_size * arch.intermediate_size
    q8_0 = weight_bytes(arch, "gguf", gguf_block="Q8_0")
    assert q8_0 == kept + linear * (1 + 2 / 32)
    assert weight_bytes(arch, "gguf", gguf_block="Q5_0") == q8_0 + 4 * down * (2 - 1 - 2 / 32)
    assert weight_bytes(arch, "gguf", gguf_block="Q4_K") == kept + linear * (0.5 + 4 / 32)  # like Q4_0
    # Q5_K has no packed layout: served gguf, its projections are dequantized like --quantization none.
    assert weight_bytes(arch, "gguf", gguf_block="Q5_K_M") == weight_bytes(arch, "none")
    assert weight_bytes(arch, "gguf", gguf_block="Q5_K_M", float_dtype="float32") == weight_bytes(
        arch, "none", "float32"
    )
    with pytest.raises(ValueError, match="unknown GGUF file type 'Q4_K_XL'.*Q4_K_M"):
        weight_bytes(arch, "gguf", gguf_block="Q4_K_XL")


def _moe_q4_k_m_linear_bytes(arch, float_bytes=2):
    """The projections of llama.cpp's Q4_K_M of a mixture-of-experts model as Pagoda holds them: each
    expert's down projection Q6_K in the layers use_more_bits picks, as attn_v; with exactly 8
    experts attn_k and attn_v Q8_0 and attn_output Q5_K (dequantized); the rest Q4_K."""
    n = arch.num_hidden_layers
    wider = [i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2 for i in range(n)]
    eight = arch.num_experts == 8
    q4_k, q6_k, q8_0 = (GGUF_BLOCK_FORMATS[t] for t in ("Q4_K", "Q6_K", "Q8_0"))
    q5_k = WeightFormat(bits=8 * float_bytes)
    h, q, kv, m = arch.hidden_size, arch.q_size, arch.kv_size, arch.moe_intermediate_size
    total = 0
    for layer in range(n):
        value = q8_0 if eight else q6_k if wider[layer] else q4_k
        total += q4_k.linear_bytes(q, h) + (q8_0 if eight else q4_k).linear_bytes(kv, h)
        total += value.linear_bytes(kv, h) + (q5_k if eight else q4_k).linear_bytes(h, q)
        down = q6_k if wider[layer] else q4_k
        total += arch.num_experts * (2 * q4_k.linear_bytes(m, h) + down.linear_bytes(h, m))
    return total


@pytest.mark.parametrize("family", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_a_moe_q4_k_m_file_is_sized_expert_by_expert_in_each_tensors_block_type(family):
    arch = KNOWN_ARCHITECTURES[family]
    served = 2 * arch.unquantized_parameters() + _moe_q4_k_m_linear_bytes(arch)
    assert weight_bytes(arch, "gguf", gguf_block="Q4_K_M") == served
    # Counted as if every expert were Q4_K (as served: 5 bits a weight), the Q6_K down projections
    # (9 bits) of 24 of Qwen3-30B-A3B's 48 layers would be missed: 2.3 of its 19.7 GiB.
    main = GGUF_BLOCK_FORMATS["Q4_K"]
    all_q4_k = sum(main.linear_bytes(o, i) * c for o, i, c in arch.linear_shapes())
    assert served - 2 * arch.unquantized_parameters() > all_q4_k * 1.03
    # A batch-1 step reads the experts it is routed to: of each layer, num_experts_per_tok in the
    # layer's own block types.
    idle = arch.num_experts - arch.num_experts_per_tok
    n, m, h = arch.num_hidden_layers, arch.moe_intermediate_size, arch.hidden_size
    wider = sum(i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2 for i in range(n))
    q6_k = GGUF_BLOCK_FORMATS["Q6_K"]
    expert = n * (2 * main.linear_bytes(m, h) + main.linear_bytes(h, m))
    expert += wider * (q6_k.linear_bytes(h, m) - main.linear_bytes(h, m))
    embedding = arch.vocab_size * h * 2
    read = served - idle * expert - (0 if arch.tie_word_embeddings else embedding)
    assert decode_weight_bytes(arch, "gguf", gguf_block="Q4_K_M") == read


def test_a_fused_qkv_is_sized_in_the_block_type_llama_cpp_gives_attn_qkv():
    # Phi-4-mini's checkpoint stores q, k and v as one tensor, which Q4_K_M stores in Q5_K: served
    # dequantized, in bf16, while its unfused parts would be Q4_K.
    arch = KNOWN_ARCHITECTURES["phi-4-mini"]
    assert arch.fused_qkv
    unfused = replace(arch, fused_qkv=False)
    qkv = (arch.q_size + 2 * arch.kv_size) * arch.hidden_size * arch.num_hidden_layers
    q4_k = GGUF_BLOCK_FORMATS["Q4_K"]
    q4_k_qkv = sum(
        q4_k.linear_bytes(rows, arch.hidden_size) * arch.num_hidden_layers
        for rows in (arch.q_size, arch.kv_size, arch.kv_size)
    )
    fused, split = (
        weight_bytes(arch, "gguf", gguf_block="Q4_K_M"),
        weight_bytes(unfused, "gguf", gguf_block="Q4_K_M"),
    )
    # The unfused model's attn_v is bounded at bf16 (the 70B rule) beside Q6_K in the wider layers.
    n = arch.num_hidden_layers
    wider = sum(i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2 for i in range(n))
    value = arch.kv_size * arch.hidden_size
    split_v = (
        wider * GGUF_BLOCK_FORMATS["Q6_K"].linear_bytes(arch.kv_size, arch.hidden_size)
        + (n - wider) * 2 * value
    )
    split_qkv = q4_k_qkv - q4_k.linear_bytes(arch.kv_size, arch.hidden_size) * n + split_v
    assert fused - split == 2 * qkv - split_qkv
    # Q6_K stores attn_qkv in Q6_K like the rest.
    assert weight_bytes(arch, "gguf", gguf_block="Q6_K") == weight_bytes(unfused, "gguf", gguf_block="Q6_K")


def test_an_8b_q4_k_m_fits_a_12_gib_gpu_that_its_dequantized_weights_do_not():
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    assert fits(arch, "gguf", 8192, 12 * GIB, gguf_block="Q4_K_M").fits
    assert not fits(arch, "none", 8192, 12 * GIB).fits


def test_tensor_parallel_divides_weights_and_kv_per_gpu():
    arch = KNOWN_ARCHITECTURES["llama-3-70b"]
    whole = fits(arch, "none", 8192, 80 * GIB)
    split = fits(arch, "none", 8192, 80 * GIB, tensor_parallel_size=4)
    assert not whole.fits and split.fits
    # Only the norms are whole on every GPU; they are a rounding error beside the rest.
    assert whole.weight_bytes / 4 < split.weight_bytes < whole.weight_bytes / 4 * 1.001
    assert split.kv_bytes == whole.kv_bytes // 4
    assert split.all_reduce_bytes > 0 and whole.all_reduce_bytes == 0
    parts = (split.weight_bytes, split.kv_bytes, split.overhead_bytes, split.all_reduce_bytes)
    assert split.required_bytes == sum(parts)
    assert "per GPU of 4" in split.describe()


def test_more_ranks_than_kv_heads_replicate_them():
    arch = KNOWN_ARCHITECTURES["llama-3-70b"]  # 8 KV heads
    assert check_tensor_parallel(arch, 16).num_key_value_heads == 1
    with pytest.raises(ValueError, match="key/value heads"):
        check_tensor_parallel(replace(arch, num_attention_heads=48, num_key_value_heads=8), 12)


def test_a_size_that_does_not_divide_the_heads_names_the_ones_that_do():
    arch = KNOWN_ARCHITECTURES["smollm2-135m"]  # 9 heads, 3 KV heads
    with pytest.raises(ValueError, match=r"9 attention heads .* divides 9: 1, 3, 9"):
        fits(arch, "none", 2048, 80 * GIB, tensor_parallel_size=2)
    assert check_tensor_parallel(arch, 3).num_attention_heads == 3


def test_grouped_quantization_splits_row_parallel_inputs_at_group_boundaries():
    arch = KNOWN_ARCHITECTURES["smollm2-135m"]  # o_proj takes 576 inputs: int4 groups of 64
    assert check_tensor_parallel(arch, 3, "int4").num_attention_heads == 3
    assert check_tensor_parallel(arch, 3, "gguf").intermediate_size == 512
    with pytest.raises(ValueError, match="groups of 128 inputs.*attention output"):
        check_tensor_parallel(arch, 3, "gptq", group_size=128)
    # Per-row scales (int8, fp8, or a checkpoint's group of -1) split anywhere.
    assert check_tensor_parallel(arch, 3, "int8").num_attention_heads == 3
    assert check_tensor_parallel(arch, 3, "awq", group_size=-1).num_key_value_heads == 1


def test_a_mixture_of_experts_counts_every_expert():
    # Mixtral-8x7B's published count, experts and routers included.
    assert KNOWN_ARCHITECTURES["mixtral-8x7b"].num_parameters() == 46_702_792_704
    # Qwen3-30B-A3B's published count, its per-head q/k norms (48 x 2 x 128) included.
    moe = KNOWN_ARCHITECTURES["qwen3-30b-a3b"]
    assert moe.num_parameters() == 30_532_122_624
    # About 3B of them are active per token: 8 of 128 experts.
    assert 3.0e9 < moe.active_linear_parameters() + moe.vocab_parameters() / 2 < 3.5e9


def test_the_fit_gate_sizes_a_30b_total_3b_active_model_by_its_30b():
    moe = KNOWN_ARCHITECTURES["qwen3-30b-a3b"]
    assert weight_bytes(moe, "none") > 60 * 10**9
    assert not fits(moe, "none", 8192, 48 * GIB).fits
    assert fits(moe, "int4", 8192, 48 * GIB).fits
    # Each of two ranks holds half of every expert's channels.
    assert weight_bytes(check_tensor_parallel(moe, 2), "none") < 0.51 * weight_bytes(moe, "none")


def test_expert_groups_must_not_be_cut_by_the_tensor_parallel_split():
    moe = KNOWN_ARCHITECTURES["qwen3-30b-a3b"]
    check_tensor_parallel(moe, 2, "int4")  # 384 expert channels per rank: three groups of 128
    with pytest.raises(ValueError, match="expert down projection's 768 inputs"):
        check_tensor_parallel(moe, 4, "int4")


def test_sliding_window_layers_hold_at_most_their_window_of_kv():
    gemma = KNOWN_ARCHITECTURES["gemma-3-12b"]  # 8 global layers, 40 of window 1024
    per_layer = 2 * gemma.kv_size * 2
    assert kv_bytes_for_context(gemma, 512) == 48 * 512 * per_layer
    assert kv_bytes_for_context(gemma, 32768) == (8 * 32768 + 40 * 1024) * per_layer
    # A 32K context needs under a fifth of what every layer keeping every token would.
    assert kv_bytes_for_context(gemma, 32768) < 0.2 * 32768 * kv_bytes_per_token(gemma)
    # Its whole 128K context fits 40 GiB beside its bf16 weights; without windows it would not.
    assert fits(gemma, "none", 131072, 40 * GIB).fits
    assert not fits(replace(gemma, sliding_window=None, layer_types=()), "none", 131072, 40 * GIB).fits


def test_the_kv_budget_gives_window_layers_what_their_sequences_can_hold_and_full_layers_the_rest():
    gemma = KNOWN_ARCHITECTURES["gemma-3-12b"]
    budget = 20 * GIB
    layer_block = 16 * 2 * gemma.kv_size * 2
    pools = kv_pools(gemma, budget, 16, 131072, max_num_seqs=8, max_num_batched_tokens=8192)
    # Eight sequences' windows (64 blocks and 2 more each) and a step of 8192 tokens.
    assert pools.window_blocks == window_blocks_needed(1024, 16, 8, 8192) == 8 * 66 + 512
    assert pools.full_blocks == (budget - pools.window_blocks * 40 * layer_block) // (8 * layer_block)
    # Without windows the same budget holds under a quarter of that context.
    unwindowed = replace(gemma, sliding_window=None, layer_types=())
    assert pools.full_blocks > 4 * kv_pools(unwindowed, budget, 16, 131072, 8, 8192).full_blocks
    # Many sequences: both pools equal, as without windows.
    crowded = kv_pools(gemma, budget, 16, 131072, max_num_seqs=256, max_num_batched_tokens=8192)
    assert crowded.full_blocks == crowded.window_blocks == budget // (48 * layer_block)
    # Every layer slides (Mistral 7B v0.1): one pool, the window one; a window as long as the
    # context: one pool as before.
    mistral = replace(KNOWN_ARCHITECTURES["mistral-7b"], sliding_window=4096)
    assert kv_pools(mistral, budget, 16, 32768, 8, 8192).full_blocks == 0
    assert kv_pools(mistral, budget, 16, 4096, 8, 8192).window_blocks == 0


def test_latent_attention_counts_its_low_rank_projections_and_caches_one_latent_a_token():
    # DeepSeek-V2-Lite (its config.json: tests/runtime/test_model_catalogue.py): 15.7B parameters,
    # 2.4B of them a token's.
    lite = KNOWN_ARCHITECTURES["deepseek-v2-lite"]
    assert round(lite.num_parameters() / 1e9, 1) == 15.7
    assert round((lite.active_linear_parameters() + lite.vocab_parameters() // 2) / 1e9, 1) == 2.4
    # Absorbed: one plane of the latent and the rotated key a token and layer, in bf16, where every
    # head's key and value would take 27 x 2 x 16 x 192 x 2 bytes (12 times more).
    assert kv_bytes_per_token(lite) == 27 * (512 + 64) * 2
    # Two ranks split the heads of q, kv_b and o; kv_a, its norm and the cached latent stay whole.
    half = lite.per_rank(2)
    attention = lite.attention_linear_shapes()
    assert half.attention_linear_shapes()[1] == attention[1] == (512 + 64, 2048, 27)
    assert half.attention_output_size == 8 * 128
    assert kv_bytes_per_token(half) == kv_bytes_per_token(lite)
    # kv_b_proj, absorbed, is held unquantized (in 16 bits under every quantization), split by heads.
    kv_b = 16 * (128 + 128) * 512 * 27
    assert half.unquantized_parameters() - replace(half, kv_lora_rank=0).unquantized_parameters() == (
        kv_b // 2 + 512 * 27
    )


def test_an_ungated_mlp_is_sized_without_its_gate_as_loaded(tmp_path):
    """Arcee's, Nemotron's and Apertus' MLP: up and down only, two of the gated MLP's three
    matrices; the prediction is what the loaded model holds, Nemotron's norm biases and Apertus'
    activation parameters included."""
    from pagoda_runtime import LLM

    from tests.runtime.tiny_models import build_tiny_model

    gated = KNOWN_ARCHITECTURES["llama-3-8b"]
    ungated = replace(gated, gated_mlp=False)
    mlp = gated.hidden_size * gated.intermediate_size * gated.num_hidden_layers
    assert gated.num_parameters() - ungated.num_parameters() == mlp
    for variant in ("arcee", "nemotron", "apertus"):
        llm = LLM(str(build_tiny_model(tmp_path / variant, variant)), dtype="float32", device="cpu")
        memory = llm.engine.memory
        assert not llm.engine.model_config.architecture.gated_mlp
        assert memory.weight_bytes == memory.predicted_weight_bytes, memory
