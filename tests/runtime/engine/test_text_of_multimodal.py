"""Multimodal checkpoints served for their text: a tiny Gemma3ForConditionalGeneration, a tiny
Mistral3ForConditionalGeneration and a tiny Llama4ForConditionalGeneration, saved by transformers as
the hub holds them (the language model under language_model., a vision tower beside it), decode as
transformers' own multimodal model does on text, with text_config cut to the keys that differ from
transformers' defaults as the released Gemma 3 configs are."""

import json

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.loading.text_of_multimodal import text_tensor_name
from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Llama4Config,
    Llama4ForConditionalGeneration,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
)

from tests.runtime.engine.hf_reference import hf_greedy
from tests.runtime.tiny_models import build_tiny_model

PROMPTS = ["Hello, world! How are", "The quick brown fox jumps over the lazy dog. She"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
_VISION |= dict(image_size=28, patch_size=14)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def multimodal(root, variant):
    """A tiny multimodal model around the tiny `variant` text model's config and tokenizer."""
    text = build_tiny_model(root / "text", variant)
    text_config = AutoConfig.from_pretrained(text).to_dict()
    torch.manual_seed(0)
    if variant == "gemma3":
        config = Gemma3Config(text_config=text_config, vision_config=_VISION, mm_tokens_per_image=4)
        model = Gemma3ForConditionalGeneration(config)
    elif variant == "llama4":
        vision = {**_VISION, "vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32}
        model = Llama4ForConditionalGeneration(Llama4Config(text_config=text_config, vision_config=vision))
    else:
        vision = {**_VISION, "model_type": "pixtral", "head_dim": 16}
        model = Mistral3ForConditionalGeneration(
            Mistral3Config(text_config=text_config, vision_config=vision, spatial_merge_size=1)
        )
    folder = root / "multimodal"
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (text / name).is_file():
            (folder / name).write_bytes((text / name).read_bytes())
    return folder


def drop_defaults(folder):
    """text_config reduced to what differs from transformers' defaults, as Gemma 3's hub configs are."""
    raw = json.loads((folder / "config.json").read_text())
    text = raw["text_config"]
    defaults = AutoConfig.for_model(text["model_type"]).to_dict()
    kept = {k: v for k, v in text.items() if k == "model_type" or defaults.get(k, object()) != v}
    assert len(kept) < len(text)
    raw["text_config"] = kept
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("variant", ["gemma3", "mistral", "llama4"])
def test_a_multimodal_checkpoint_serves_its_text_as_transformers_does(tmp_path, variant):
    folder = multimodal(tmp_path, variant)
    with safe_open(folder / "model.safetensors", "pt") as f:
        vision_tensors = ("vision_tower.", "model.vision_tower.", "vision_model.")
        assert any(name.startswith(vision_tensors) for name in f.keys())  # noqa: SIM118
    reference = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    drop_defaults(folder)
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16)
    for out in llm.generate(PROMPTS, GREEDY):
        assert out.outputs[0].token_ids == hf_greedy(reference, out.prompt_token_ids, 10), out.prompt


def test_only_the_language_models_tensors_are_read():
    up = "mlp.up_proj.weight"
    assert text_tensor_name(f"language_model.model.layers.0.{up}") == f"model.layers.0.{up}"
    assert text_tensor_name("model.language_model.norm.weight") == "model.norm.weight"
    assert text_tensor_name("language_model.lm_head.weight") == "lm_head.weight"
    assert text_tensor_name("lm_head.weight") == "lm_head.weight"
    assert text_tensor_name("vision_tower.vision_model.embeddings.patch_embedding.weight") is None
    assert text_tensor_name("multi_modal_projector.mm_input_projection_weight") is None
