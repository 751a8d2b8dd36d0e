"""Every tensor a Llama-family model has, by its Hugging Face name, and the shape its config implies.

The loaders check a checkpoint against it, the model reports what a checkpoint left out by it, and
the benchmarks draw random weights from it. Torch-free.
"""

from __future__ import annotations

from pagoda_runtime.contract.sizing import ModelArchitecture


def is_projection(hf_name: str) -> bool:
    """Whether a weight is one of the decoder's linear projections, the layers quantization touches."""
    return hf_name.startswith("model.layers.") and hf_name.endswith("_proj.weight")


def expected_weight_shapes(arch: ModelArchitecture) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by Hugging Face name, with the shape the architecture implies."""
    hidden, inter = arch.hidden_size, arch.intermediate_size
    shapes = {"model.embed_tokens.weight": (arch.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    for i in range(arch.num_hidden_layers):
        layer = f"model.layers.{i}."
        shapes[layer + "input_layernorm.weight"] = (hidden,)
        shapes[layer + "post_attention_layernorm.weight"] = (hidden,)
        shapes[layer + "self_attn.q_proj.weight"] = (arch.q_size, hidden)
        shapes[layer + "self_attn.k_proj.weight"] = (arch.kv_size, hidden)
        shapes[layer + "self_attn.v_proj.weight"] = (arch.kv_size, hidden)
        shapes[layer + "self_attn.o_proj.weight"] = (hidden, arch.q_size)
        if arch.attention_bias:
            shapes[layer + "self_attn.q_proj.bias"] = (arch.q_size,)
            shapes[layer + "self_attn.k_proj.bias"] = (arch.kv_size,)
            shapes[layer + "self_attn.v_proj.bias"] = (arch.kv_size,)
        shapes[layer + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[layer + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[layer + "mlp.down_proj.weight"] = (hidden, inter)
    return shapes
