"""Llama 4's layer pattern as its configs state it (no_rope_layers, layer_types, moe_layers or
interleave_moe_layer_step, attention_chunk_size, with transformers' defaults where left out), and
what Pagoda refuses to build in one sentence naming the field."""

from __future__ import annotations

import pytest
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.executor.models.hf_config import ConfigError
from pagoda_runtime.executor.models.llama4 import config_from_hf

BASE = {
    "hidden_size": 64,
    "intermediate_size": 32,
    "intermediate_size_mlp": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "num_local_experts": 4,
    "attention_chunk_size": 16,
}
CCCF = ("chunked_attention",) * 3 + ("full_attention",)


def test_defaults_rotate_three_layers_in_four_in_chunks_and_make_every_layer_sparse():
    config = config_from_hf(BASE, "Llama4ForCausalLM")
    arch = config.architecture
    assert arch.layer_types == CCCF * 2 and arch.attention_chunk_size == 16
    assert config.no_rope_layers == (3, 7)
    assert [arch.layer_window(i) for i in range(4)] == [16, 16, 16, None]
    assert [arch.layer_chunked(i) for i in range(4)] == [True, True, True, False]
    assert arch.mlp_only_layers == () and arch.intermediate_size == 128 and arch.moe_intermediate_size == 32
    assert config.router_weight_on_input and config.qk_l2_norm and config.attn_temperature is not None


def test_maverick_interleaves_dense_layers_and_may_turn_norms_and_temperature_off():
    config = config_from_hf(
        {**BASE, "interleave_moe_layer_step": 2, "use_qk_norm": False, "attn_temperature_tuning": False},
        "Llama4ForCausalLM",
    )
    assert config.architecture.mlp_only_layers == (0, 2, 4, 6)
    assert not config.qk_l2_norm and config.attn_temperature is None
    listed = config_from_hf({**BASE, "moe_layers": [1, 3, 5, 7]}, "Llama4ForCausalLM")
    assert listed.architecture.mlp_only_layers == (0, 2, 4, 6)


def test_without_a_chunk_size_every_layer_attends_to_the_whole_context():
    config = config_from_hf({**BASE, "attention_chunk_size": None}, "Llama4ForCausalLM")
    assert config.architecture.layer_types == () and config.architecture.layer_window(0) is None
    assert config.no_rope_layers == (3, 7)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_experts_per_tok": 2}, "routes each token to 2 experts"),
        ({"no_rope_layers": [1, 0]}, "lists no_rope_layers for 2 layers"),
        ({"layer_types": ["sliding_attention"] * 8}, "has layer_types \\['sliding_attention'\\]"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"intermediate_size_mlp": None}, "lacks 'intermediate_size_mlp'"),
    ],
)
def test_a_config_pagoda_cannot_build_is_refused_naming_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        config_from_hf({**BASE, **change}, "Llama4ForCausalLM")


def test_an_architecture_has_sliding_or_chunked_layers_never_both():
    shape = dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=512,
    )
    with pytest.raises(ValueError, match="sliding-window layers or chunked ones, not both"):
        ModelArchitecture(**shape, sliding_window=8, attention_chunk_size=8)
    with pytest.raises(ValueError, match="attention_chunk_size is unset"):
        ModelArchitecture(**shape, layer_types=("chunked_attention", "full_attention"))
