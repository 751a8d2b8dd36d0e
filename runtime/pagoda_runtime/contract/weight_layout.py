"""Every tensor a Llama-family model has, by its Hugging Face name, and the shape its config implies.

The loaders check a checkpoint against it, the model reports what a checkpoint left out by it, and
the benchmarks draw random weights from it. Torch-free.
"""

from __future__ import annotations

from pagoda_runtime.contract.config import ModelConfig


def is_projection(hf_name: str) -> bool:
    """Whether a weight is one of the decoder's linear projections, the layers quantization touches."""
    return hf_name.startswith("model.layers.") and hf_name.endswith("_proj.weight")


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by Hugging Face name, with the shape the config implies."""
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        shapes[layer + "input_layernorm.weight"] = (hidden,)
        shapes[layer + "post_attention_layernorm.weight"] = (hidden,)
        shapes[layer + "self_attn.q_proj.weight"] = (config.q_size, hidden)
        shapes[layer + "self_attn.k_proj.weight"] = (config.kv_size, hidden)
        shapes[layer + "self_attn.v_proj.weight"] = (config.kv_size, hidden)
        shapes[layer + "self_attn.o_proj.weight"] = (hidden, config.q_size)
        if config.attention_bias:
            shapes[layer + "self_attn.q_proj.bias"] = (config.q_size,)
            shapes[layer + "self_attn.k_proj.bias"] = (config.kv_size,)
            shapes[layer + "self_attn.v_proj.bias"] = (config.kv_size,)
        shapes[layer + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[layer + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[layer + "mlp.down_proj.weight"] = (hidden, inter)
    return shapes
