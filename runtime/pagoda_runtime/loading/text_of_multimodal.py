"""Multimodal checkpoints served for their text alone: Gemma 3 (4B and up ship only as
Gemma3ForConditionalGeneration), Mistral Small 3.1 / 3.2 (Mistral3ForConditionalGeneration),
Llama 4 (Llama4ForConditionalGeneration), Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5 and
Qwen3.5-MoE (their language models are Qwen2's, Qwen3's, Qwen3-MoE's and Qwen3.5's; on text the
multimodal rotary embedding's three sections all take the token's position, which is the plain one).

Their config.json nests the language model's config under text_config, often with only the keys
that differ from transformers' defaults, or (Qwen2-VL and Qwen2.5-VL as released) keeps it at the
top level beside vision_config, so the text config comes from transformers' own config classes;
their language model's tensors sit under a prefix (language_model.model. as the hub holds them,
model.language_model. as transformers 5 saves them) or under model. as a causal LM's do (Qwen2-VL,
Qwen2.5-VL), and the vision tower and projector are left unread. Images are not served: a request
with one is refused by the API like any other model's.
"""

from __future__ import annotations

from typing import Any

# The multimodal architecture -> the causal language model inside it.
TEXT_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Mistral3ForConditionalGeneration": "MistralForCausalLM",
    "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
    "Qwen2VLForConditionalGeneration": "Qwen2ForCausalLM",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2ForCausalLM",
    "Qwen3VLForConditionalGeneration": "Qwen3ForCausalLM",
    "Qwen3VLMoeForConditionalGeneration": "Qwen3MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
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
# The parts of a multimodal checkpoint that are not its language model, at the top or under model.
_OTHER_PARTS = {"vision_tower", "vision_model", "multi_modal_projector", "visual"}


def wrapped_text_architecture(raw: dict[str, Any]) -> str | None:
    """The causal LM a multimodal config.json wraps, or None for any other config."""
    wrapped = [TEXT_ARCHITECTURES[a] for a in raw.get("architectures") or () if a in TEXT_ARCHITECTURES]
    return wrapped[0] if wrapped else None


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The wrapped language model's config.json, with transformers' defaults for the keys it leaves
    out, as the causal LM's own config.json would read."""
    from transformers import AutoConfig

    architecture = wrapped_text_architecture(raw)
    text = dict(raw.get("text_config") or {})
    model_type = text.pop("model_type", None) or _TEXT_MODEL_TYPES.get(architecture)
    if "text_config" not in raw or model_type is None:
        # A flat config (Qwen2-VL, Qwen2.5-VL), or one whose text part does not name its type: the
        # wrapper's config class gathers the text part.
        wrapper = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
        full = AutoConfig.for_model(raw.get("model_type"), **wrapper).text_config.to_dict()
    else:
        full = AutoConfig.for_model(model_type, **text).to_dict()
    # The wrapper's own: whether its LM head is the embedding, and how its checkpoint is quantized.
    full |= {key: raw[key] for key in ("tie_word_embeddings", "quantization_config") if key in raw}
    return {**full, "architectures": [architecture]}


def text_tensor_name(name: str) -> str | None:
    """The causal LM's name of a multimodal checkpoint's tensor; None for the vision part's."""
    for prefix, replacement in _PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix) :]
    if name.removeprefix("model.").split(".")[0] in _OTHER_PARTS:
        return None
    return name
