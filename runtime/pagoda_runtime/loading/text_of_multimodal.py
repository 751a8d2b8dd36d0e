"""Multimodal checkpoints served for their text alone: Gemma 3 (4B and up ship only as
Gemma3ForConditionalGeneration), Mistral Small 3.1 / 3.2 (Mistral3ForConditionalGeneration) and
Llama 4 (Llama4ForConditionalGeneration).

Their config.json nests the language model's config under text_config, often with only the keys
that differ from transformers' defaults, so the defaults come from transformers' own config class;
their language model's tensors sit under a prefix (language_model.model. as the hub holds them,
model.language_model. as transformers 5 saves them), and the vision tower and projector are left
unread. Images are not served: a request with one is refused by the API like any other model's.
"""

from __future__ import annotations

from typing import Any

# The multimodal architecture -> the causal language model inside it.
TEXT_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Mistral3ForConditionalGeneration": "MistralForCausalLM",
    "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
}
# The text config's model_type where text_config leaves it out (transformers' default for each).
_TEXT_MODEL_TYPES = {
    "Gemma3ForCausalLM": "gemma3_text",
    "MistralForCausalLM": "mistral",
    "Llama4ForCausalLM": "llama4_text",
}
# Where a multimodal checkpoint keeps its language model's tensors -> where a causal LM keeps them.
_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("lm_head.", "lm_head."),
)


def wrapped_text_architecture(raw: dict[str, Any]) -> str | None:
    """The causal LM a multimodal config.json wraps, or None for any other config."""
    wrapped = [TEXT_ARCHITECTURES[a] for a in raw.get("architectures") or () if a in TEXT_ARCHITECTURES]
    return wrapped[0] if wrapped else None


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The wrapped language model's config.json, with transformers' defaults for the keys it leaves
    out, as the causal LM's own config.json would read."""
    from transformers import AutoConfig

    text = dict(raw.get("text_config") or {})
    model_type = text.pop("model_type", None) or _TEXT_MODEL_TYPES[wrapped_text_architecture(raw)]
    full = AutoConfig.for_model(model_type, **text).to_dict()
    # The wrapper's own: whether its LM head is the embedding, and how its checkpoint is quantized.
    full |= {key: raw[key] for key in ("tie_word_embeddings", "quantization_config") if key in raw}
    return {**full, "architectures": [wrapped_text_architecture(raw)]}


def text_tensor_name(name: str) -> str | None:
    """The causal LM's name of a multimodal checkpoint's tensor; None for the vision part's."""
    for prefix, replacement in _PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix) :]
    return None
