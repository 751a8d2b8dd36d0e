"""The tensors of a decoder checkpoint, by their Hugging Face names, with the shapes its architecture
implies: the parts every family's layout is made of (each family composes its own in its module,
executor/models/), and the Llama layout they all start from.

The loaders check a checkpoint against a family's layout, the model reports what a checkpoint left
out by it, and the benchmarks draw random weights from it. Torch-free.
"""

from __future__ import annotations

from pagoda_runtime.contract.sizing import ModelArchitecture

Shapes = dict[str, tuple[int, ...]]


def is_projection(hf_name: str) -> bool:
    """Whether a weight is one of the decoder's linear projections, the layers quantization touches
    (mixture-of-experts experts included; their router is not)."""
    if not hf_name.startswith("model.layers."):
        return False
    # kv_a_proj_with_mqa: DeepSeek's latent key/value projection.
    if hf_name.endswith(("_proj.weight", "_proj_with_mqa.weight")):
        return True
    return ".experts." in hf_name and hf_name.endswith(".weight")


def vocabulary_shapes(arch: ModelArchitecture) -> Shapes:
    """The embedding, the final norm and, unless tied, the LM head."""
    hidden = arch.hidden_size
    shapes = {"model.embed_tokens.weight": (arch.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    return shapes


def attention_shapes(arch: ModelArchitecture, layer: str) -> Shapes:
    """q, k, v and o projections (and their biases) of the layer whose names start with `layer`."""
    hidden = arch.hidden_size
    shapes = {
        layer + "self_attn.q_proj.weight": (arch.q_size, hidden),
        layer + "self_attn.k_proj.weight": (arch.kv_size, hidden),
        layer + "self_attn.v_proj.weight": (arch.kv_size, hidden),
        layer + "self_attn.o_proj.weight": (hidden, arch.q_size),
    }
    if arch.attention_bias:
        shapes[layer + "self_attn.q_proj.bias"] = (arch.q_size,)
        shapes[layer + "self_attn.k_proj.bias"] = (arch.kv_size,)
        shapes[layer + "self_attn.v_proj.bias"] = (arch.kv_size,)
    if arch.attention_output_bias:
        shapes[layer + "self_attn.o_proj.bias"] = (hidden,)
    return shapes


def mamba_shapes(arch: ModelArchitecture, layer: str) -> Shapes:
    """A Mamba-2 layer's tensors (models/mamba2.py), with its convolution's bias."""
    mamba, heads, inner = layer + "mamba.", arch.mamba_num_heads, arch.mamba_intermediate_size
    return {
        mamba + "in_proj.weight": (inner + arch.mamba_conv_dim + heads, arch.hidden_size),
        mamba + "conv1d.weight": (arch.mamba_conv_dim, 1, arch.mamba_conv_kernel),
        mamba + "conv1d.bias": (arch.mamba_conv_dim,),
        mamba + "dt_bias": (heads,),
        mamba + "A_log": (heads,),
        mamba + "D": (heads,),
        mamba + "norm.weight": (inner,),
        mamba + "out_proj.weight": (arch.hidden_size, inner),
    }


def mlp_shapes(prefix: str, hidden: int, width: int) -> Shapes:
    """gate, up and down of a gated MLP `width` channels wide, under `prefix`."""
    return {
        prefix + "gate_proj.weight": (width, hidden),
        prefix + "up_proj.weight": (width, hidden),
        prefix + "down_proj.weight": (hidden, width),
    }


# The sigmoid routers' correction bias per expert (GLM-4.5, DeepSeek V3), under a layer.
SCORE_BIAS = "mlp.gate.e_score_correction_bias"


def sparse_mlp_shapes(
    arch: ModelArchitecture, layer: str, score_bias: tuple[str, tuple[int, ...]] | None = None
) -> Shapes:
    """A mixture-of-experts MLP under `layer`: the router (mlp.gate), each expert's gate, up and down,
    the shared experts where the model has them, and, where the router has one, its correction
    bias: SCORE_BIAS [E], or `score_bias`'s name and shape (ERNIE 4.5's [1, E] elsewhere)."""
    hidden = arch.hidden_size
    shapes = {layer + "mlp.gate.weight": (arch.num_experts, hidden)}
    if arch.router_score_bias:
        name, shape = score_bias or (SCORE_BIAS, (arch.num_experts,))
        shapes[layer + name] = shape
    for e in range(arch.num_experts):
        shapes |= mlp_shapes(f"{layer}mlp.experts.{e}.", hidden, arch.moe_intermediate_size)
    if arch.shared_expert_intermediate_size:
        shapes |= mlp_shapes(layer + "mlp.shared_experts.", hidden, arch.shared_expert_intermediate_size)
    return shapes


def fused_expert_shapes(arch: ModelArchitecture, block: str) -> Shapes:
    """A layer's experts as two fused tensors under `block` (Llama 4's feed_forward., Qwen3-VL-MoE's
    mlp.): experts.gate_up_proj [E, H, 2I], gate then up along the last axis, and experts.down_proj
    [E, I, H] (executor/models/moe.fused_expert_parts takes them apart)."""
    experts, hidden, width = arch.num_experts, arch.hidden_size, arch.moe_intermediate_size
    return {
        block + "experts.gate_up_proj": (experts, hidden, 2 * width),
        block + "experts.down_proj": (experts, width, hidden),
    }


def norm_shapes(layer: str, names: tuple[str, ...], size: int) -> Shapes:
    return {f"{layer}{name}.weight": (size,) for name in names}


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def decoder_shapes(
    arch: ModelArchitecture, norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
) -> Shapes:
    """The Llama layout: every tensor of a Llama, Mistral or Qwen2 checkpoint; `norms`: each layer's
    norms of hidden_size where a family holds others (OLMo's after attention and the MLP, Cohere's
    one). An ungated MLP (gated_mlp false) has no gate_proj."""
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, norms, arch.hidden_size)
        shapes |= attention_shapes(arch, layer)
        shapes |= mlp_shapes(layer + "mlp.", arch.hidden_size, arch.intermediate_size)
        if not arch.gated_mlp:
            del shapes[layer + "mlp.gate_proj.weight"]
    return shapes
