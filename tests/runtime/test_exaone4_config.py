"""EXAONE 4.0's layer pattern as its configs state it: layer_types, or a sliding_window_pattern
that is a period or a string of local (L) and global (G) layers; the global layers of a hybrid
model attend without rotary embeddings, and a model without a window rotates every layer."""

from __future__ import annotations

import pytest
from pagoda_runtime.executor.models.exaone4 import config_from_hf
from pagoda_runtime.executor.models.hf_config import ConfigError

BASE = {
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 1024,
}
LLLG = ("sliding_attention",) * 3 + ("full_attention",)


@pytest.mark.parametrize("pattern", [4, "LLLG"])
def test_a_pattern_gives_three_local_layers_in_four_and_nope_global_ones(pattern):
    config = config_from_hf(
        {**BASE, "sliding_window": 32, "sliding_window_pattern": pattern}, "Exaone4ForCausalLM"
    )
    assert config.architecture.layer_types == LLLG * 2 and config.architecture.sliding_window == 32
    assert config.no_rope_layers == (3, 7)
    listed = config_from_hf(
        {**BASE, "sliding_window": 32, "layer_types": list(LLLG * 2)}, "Exaone4ForCausalLM"
    )
    assert listed == config


def test_without_a_window_every_layer_is_global_and_rotates():
    config = config_from_hf({**BASE, "sliding_window": None}, "Exaone4ForCausalLM")
    assert config.architecture.sliding_window is None and config.no_rope_layers == ()


def test_a_pattern_that_is_neither_is_refused_naming_it():
    with pytest.raises(ConfigError, match="sliding_window_pattern 'LXG'"):
        config_from_hf({**BASE, "sliding_window": 32, "sliding_window_pattern": "LXG"}, "Exaone4ForCausalLM")
