"""Hugging Face transformers as the reference the engine's greedy tokens must equal."""

from __future__ import annotations

import torch
from pagoda_runtime.model_source import load_model_source
from transformers import LlamaConfig, LlamaForCausalLM


def hf_model_from_source(path: str) -> LlamaForCausalLM:
    """transformers' Llama holding exactly the (dequantized) tensors our loader yields for `path`."""
    source = load_model_source(path)
    c = source.config
    config = LlamaConfig(
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
        attention_bias=c.attention_bias,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    result = model.load_state_dict(dict(source.weights), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    model.tie_weights()
    return model.eval()


@torch.inference_mode()
def hf_greedy(model, prompt_token_ids: list[int], max_new_tokens: int, device: str = "cpu") -> list[int]:
    """Greedy ids running past end-of-sequence tokens, like the engine with ignore_eos."""
    ids = torch.tensor([prompt_token_ids], device=device)
    # Without an eos id generate keeps going; min_new_tokens would instead mask eos out of the argmax.
    model.generation_config.eos_token_id = None
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
    )
    return out[0, ids.shape[1] :].tolist()
