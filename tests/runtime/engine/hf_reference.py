"""Hugging Face transformers as the reference the engine's greedy tokens must equal."""

from __future__ import annotations

import torch
from pagoda_runtime.bench.hf_baseline import hf_config
from pagoda_runtime.loading.model_source import load_model_source
from transformers import LlamaForCausalLM


def hf_model_from_source(path: str) -> LlamaForCausalLM:
    """transformers' Llama holding exactly the (dequantized) tensors our loader yields for `path`."""
    source = load_model_source(path)
    config = hf_config(source.config, attn_implementation="eager")
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
