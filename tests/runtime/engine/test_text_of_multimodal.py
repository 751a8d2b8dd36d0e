"""Multimodal checkpoints served for their text: tiny Gemma3ForConditionalGeneration,
Mistral3ForConditionalGeneration, Llama4ForConditionalGeneration, Qwen2_5_VLForConditionalGeneration,
Qwen3VLForConditionalGeneration and Qwen3_5ForConditionalGeneration models, saved by transformers
as the hub holds them (the language model under language_model., or under model. beside visual.
for Qwen2.5-VL, a vision tower beside it), decode as transformers' own multimodal model does on
text, with text_config cut to the keys that differ from transformers' defaults as the released
Gemma 3 configs are, or (Qwen2.5-VL) the text config at the top level as its released configs are."""

import json

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.loading.text_of_multimodal import text_tensor_name
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Llama4Config,
    Llama4ForConditionalGeneration,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
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
    text = build_tiny_model(root / "text", QWEN_VL[variant][0] if variant in QWEN_VL else variant)
    text_config = AutoConfig.from_pretrained(text).to_dict()
    torch.manual_seed(0)
    if variant == "gemma3":
        config = Gemma3Config(text_config=text_config, vision_config=_VISION, mm_tokens_per_image=4)
        model = Gemma3ForConditionalGeneration(config)
    elif variant == "llama4":
        vision = {**_VISION, "vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32}
        model = Llama4ForConditionalGeneration(Llama4Config(text_config=text_config, vision_config=vision))
    elif variant in QWEN_VL:
        _, config_class, model_class, sections, interleaved = QWEN_VL[variant]
        rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections}
        text_config["rope_parameters"] = rope | ({"mrope_interleaved": True} if interleaved else {})
        if variant == "qwen3.5":
            text_config["rope_parameters"]["partial_rotary_factor"] = 0.25
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
        if variant == "qwen2-vl":
            vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
        if variant == "qwen3-vl":
            vision["deepstack_visual_indexes"] = []
        model = model_class(config_class(text_config=text_config, vision_config=vision))
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


# A vision-language model -> its text variant, config, model, the rotary sections of a head's
# frequencies (text, height, width) and whether they interleave (Qwen3-VL).
QWEN_VL = {
    "qwen2-vl": ("qwen2", Qwen2VLConfig, Qwen2VLForConditionalGeneration, [2, 3, 3], False),
    "qwen2.5-vl": ("qwen2", Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, [2, 3, 3], False),
    "qwen3-vl": ("qwen3", Qwen3VLConfig, Qwen3VLForConditionalGeneration, [4, 6, 6], True),
    # A hybrid of gated DeltaNet and gated attention layers, RoPE on a quarter of each head.
    "qwen3.5": ("qwen3_5", Qwen3_5Config, Qwen3_5ForConditionalGeneration, [2, 1, 1], True),
}


def flatten(folder):
    """The text config at the top level beside vision_config, as Qwen2-VL's and Qwen2.5-VL's
    released config.json files hold it."""
    raw = json.loads((folder / "config.json").read_text())
    text = raw.pop("text_config")
    rope = text.pop("rope_parameters")
    raw |= {k: v for k, v in text.items() if k not in ("model_type", "architectures")}
    raw |= {
        "rope_theta": rope["rope_theta"],
        "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]},
    }
    (folder / "config.json").write_text(json.dumps(raw))


def drop_defaults(folder):
    """text_config reduced to what differs from transformers' defaults, as Gemma 3's hub configs are."""
    raw = json.loads((folder / "config.json").read_text())
    text = raw["text_config"]
    defaults = AutoConfig.for_model(text["model_type"]).to_dict()
    kept = {k: v for k, v in text.items() if k == "model_type" or defaults.get(k, object()) != v}
    assert len(kept) < len(text)
    raw["text_config"] = kept
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("variant", ["gemma3", "mistral", "llama4", *QWEN_VL])
def test_a_multimodal_checkpoint_serves_its_text_as_transformers_does(tmp_path, variant):
    folder = multimodal(tmp_path, variant)
    with safe_open(folder / "model.safetensors", "pt") as f:
        vision_tensors = ("vision_tower.", "model.vision_tower.", "vision_model.", "visual.", "model.visual.")
        assert any(name.startswith(vision_tensors) for name in f.keys())  # noqa: SIM118
    reference = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    # Qwen2-VL's and Qwen2.5-VL's released configs are flat.
    (flatten if variant in ("qwen2-vl", "qwen2.5-vl") else drop_defaults)(folder)
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16)
    for out in llm.generate(PROMPTS, GREEDY):
        assert out.outputs[0].token_ids == hf_greedy(reference, out.prompt_token_ids, 10), out.prompt


def test_qwen3_vl_moe_serves_its_text_with_the_experts_stored_fused(tmp_path):
    """Qwen3-VL-MoE's checkpoints hold each layer's experts as gate_up_proj [E, H, 2I] and down_proj
    [E, I, H], transposed from transformers' own parameters (transformers 5 transposes them at load;
    it cannot yet save them back, so the folder is written here in the hub's layout)."""
    text = build_tiny_model(tmp_path / "text", "qwen3_moe")
    text_config = AutoConfig.from_pretrained(text).to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    config = Qwen3VLMoeConfig(
        text_config=text_config, vision_config={**vision, "deepstack_visual_indexes": []}
    )
    torch.manual_seed(0)
    reference = Qwen3VLMoeForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if name.endswith(("mlp.gate.weight", "experts.gate_up_proj", "experts.down_proj")):
                parameter.normal_(0.0, 0.5)  # routers far from ties, experts that matter
    folder = tmp_path / "multimodal"
    folder.mkdir()
    tensors = {}
    for name, tensor in reference.state_dict().items():
        fused = name.endswith(("experts.gate_up_proj", "experts.down_proj"))
        tensors[name] = (tensor.transpose(1, 2) if fused else tensor).contiguous()
    save_file(tensors, folder / "model.safetensors")
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in tensors
    raw = {**config.to_dict(), "architectures": ["Qwen3VLMoeForConditionalGeneration"]}
    (folder / "config.json").write_text(json.dumps(raw))
    for name in TOKENIZER_FILES:
        if (text / name).is_file():
            (folder / name).write_bytes((text / name).read_bytes())
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
    # Qwen2.5-VL as released: the language model under model., the vision tower under visual.
    assert text_tensor_name(f"model.layers.0.{up}") == f"model.layers.0.{up}"
    assert text_tensor_name("visual.blocks.0.attn.qkv.weight") is None
    assert text_tensor_name("model.visual.merger.mlp.0.weight") is None
