"""The bundled SmolLM2-135M as a Hugging Face LlamaForCausalLM, with its projections swappable.

Until the engine's own model scores texts, this gives the quality tests a real trained model:
the weights come through the runtime's GGUF loader (dequantized Q4_1, rows un-permuted), and
`quantize_projections` replaces every q/k/v/o/gate/up/down nn.Linear with a QuantizedLinear.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pagoda_runtime.bundled import resolve_model
from pagoda_runtime.model_source import load_model_source
from pagoda_runtime.quantization.linear import make_linear
from transformers import LlamaConfig, LlamaForCausalLM

EVAL_TEXT = Path(__file__).parents[2] / "data" / "eval_text.txt"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def bundled_hf_llama() -> tuple[LlamaForCausalLM, list[int]]:
    """The float32 reference model and the token ids of the committed evaluation text."""
    source = load_model_source(resolve_model("smollm2-135m"))
    c = source.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
    )
    model = LlamaForCausalLM(hf_config).eval()
    missing, _ = model.load_state_dict(dict(source.weights), strict=False)
    assert set(missing) <= {"lm_head.weight"}, missing  # tied to the embeddings
    model.tie_weights()
    token_ids = source.tokenizer.encode(EVAL_TEXT.read_text(), add_special_tokens=False)
    return model, token_ids


def quantize_projections(model: LlamaForCausalLM, method: str) -> None:
    """Replace the decoder projections in place with make_linear(method) layers of the same weights."""
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                dense = getattr(block, name, None)
                if dense is None:
                    continue
                quantized = make_linear(
                    dense.in_features, dense.out_features, False, method, dtype=torch.float32
                )
                quantized.load(dense.weight.data)
                setattr(block, name, quantized)


@torch.no_grad()
def next_token_logits(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float()


def load_gguf_projections(model: LlamaForCausalLM) -> None:
    """Replace the projections with the bundled file's own Q4_1 blocks, kept quantized."""
    from pagoda_runtime.gguf_reader import GGUFFile
    from pagoda_runtime.model_source import unpermute_rotary
    from pagoda_runtime.quantization.gguf_blocks import gguf_to_packed

    gguf_file = GGUFFile(resolve_model("smollm2-135m"))
    config = model.config
    gguf_names = {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
    }
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for index, layer in enumerate(model.model.layers):
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                dense = getattr(block, name, None)
                if dense is None:
                    continue
                info = gguf_file.tensors[f"blk.{index}.{gguf_names[name]}.weight"]
                packed = gguf_to_packed(gguf_file.raw_bytes(info.name), info.ggml_type, info.shape)
                if name in heads:  # llama.cpp stores q/k rows permuted; whole rows move back exactly
                    order = torch.arange(packed.out_features, dtype=torch.float32)[:, None]
                    packed = packed.rows(unpermute_rotary(order, heads[name])[:, 0].long())
                quantized = make_linear(
                    dense.in_features, dense.out_features, False, "gguf", dtype=torch.float32
                )
                quantized.load(packed)
                setattr(block, name, quantized)
