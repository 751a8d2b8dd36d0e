"""Tiny random Hugging Face model folders, one per architecture variant the runtime supports.

`build_tiny_model(folder, variant)` writes config.json, generation_config.json, safetensors
weights (one file, or shards with model.safetensors.index.json when `sharded=True`) and a
tokenizer (tokenizer.json, tokenizer_config.json, chat template) trained on a small built-in
corpus, then returns the folder. Everything derives from a fixed seed, so the same call always
writes the same bytes, and it takes well under a second once transformers is imported.

Variants (see VARIANTS): "llama2" (multi-head attention, Metaspace BPE with byte fallback and a
BOS token), "llama3" (GQA, llama3 rope scaling, byte-level BPE with <|begin_of_text|>, two eos
ids), "llama_linear_rope" (linear rope scaling), "mistral" (GQA, sliding window),
"qwen2" (bias on q/k/v, ChatML, no BOS), "smollm" (tied embeddings, ChatML, no BOS) and "gqa"
(8 query heads sharing 2 key/value heads). The weights use a wide init and random norm weights
and biases, so greedy decoding is far from ties and a mis-loaded norm or bias changes the output.
Use the folder with `pagoda_runtime.loading.model_source.load_model_source(folder)` and, as the
reference, `transformers.AutoModelForCausalLM.from_pretrained(folder)`.

`build_tiny_gguf(hf_folder, path, ggml_type)` converts such a folder (byte-level tokenizer
variants: llama3 without its rope scaling, qwen2, smollm, gqa) to a GGUF file the way llama.cpp's
converter does, Q/K rows permuted for the llama architecture included, with the 2-D weights
stored as F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0 or Q4_1 (row length 64 fits the 32-element
blocks), or, for a folder built with rows of a multiple of 256 (`sizes`), as Q4_K, Q5_K, Q6_K or
the mixes Q4_K_M and Q5_K_M (MIXES).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from tests.runtime.k_quants import K_QUANTIZERS

SEED = 1234

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 -7",
    "Café naïve résumé — déjà vu, Straße, Ærø, smørrebrød.",
    "日本語のテキストと中文文本 한국어 텍스트",
    "Emoji: 😀 🎉 👍🏽 🇫🇷 ❤️ 🚀",
    "   leading spaces, trailing spaces   and   runs of    whitespace\n\n\n",
    'JSON: {"key": [1, 2, 3], "nested": {"ok": true, "none": null}}',
    "Once upon a time there was a little model that learned to talk.",
    "She sells sea shells by the sea shore; the shells she sells are sea shells.",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role']"
    " + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA2_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] '"
    " + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)

_SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    initializer_range=0.2,
)

# variant -> (config class, tokenizer style, extra config fields)
VARIANTS: dict[str, tuple[type, str, dict]] = {
    "llama2": (LlamaConfig, "metaspace", {"num_key_value_heads": 4}),
    "llama3": (
        LlamaConfig,
        "llama3",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama_linear_rope": (LlamaConfig, "metaspace", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "mistral": (MistralConfig, "metaspace", {"sliding_window": 256}),
    "qwen2": (Qwen2Config, "chatml", {"rope_theta": 1000000.0}),
    "smollm": (LlamaConfig, "chatml", {"tie_word_embeddings": True, "num_attention_heads": 8}),
    "gqa": (LlamaConfig, "chatml", {"num_attention_heads": 8, "num_key_value_heads": 2}),
}

# style -> (special tokens, bos, eos tokens, adds bos, chat template)
_TOKENIZER_STYLES = {
    "metaspace": (["<unk>", "<s>", "</s>"], "<s>", ["</s>"], True, LLAMA2_TEMPLATE),
    "llama3": (
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        ["<|end_of_text|>", "<|eot_id|>"],
        True,
        LLAMA3_TEMPLATE,
    ),
    "chatml": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        None,
        ["<|im_end|>", "<|endoftext|>"],
        False,
        CHATML_TEMPLATE,
    ),
}


def _byte_level_tokenizer(specials: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def _metaspace_tokenizer(specials: list[str]) -> Tokenizer:
    """Llama-2 / Mistral style: '▁' marks spaces, unknown characters fall back to <0xNN> byte tokens."""
    pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    draft = Tokenizer(models.BPE())
    draft.pre_tokenizer = pre
    draft.train_from_iterator(_CORPUS[:6], trainers.BpeTrainer(vocab_size=200, show_progress=False))
    trained = json.loads(draft.to_str())["model"]
    vocab = {token: i for i, token in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for token in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(specials)
    return tokenizer


def _save_tokenizer(folder: Path, style: str) -> tuple[int, int | None, list[int]]:
    specials, bos, eos, adds_bos, template = _TOKENIZER_STYLES[style]
    tokenizer = _metaspace_tokenizer(specials) if style == "metaspace" else _byte_level_tokenizer(specials)
    if adds_bos:
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos[0],
        unk_token="<unk>" if style == "metaspace" else None,
        chat_template=template,
        add_bos_token=adds_bos,
    )
    fast.save_pretrained(folder)
    bos_id = tokenizer.token_to_id(bos) if bos else None
    return tokenizer.get_vocab_size(), bos_id, [tokenizer.token_to_id(t) for t in eos]


def build_tiny_model(
    folder: str | Path,
    variant: str,
    *,
    sharded: bool = False,
    dtype: torch.dtype = torch.float32,
    sizes: dict | None = None,
) -> Path:
    """sizes: overrides of _SIZES (K-quant GGUF files need rows of a multiple of 256 weights)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_class, style, extra = VARIANTS[variant]
    tokenizer_vocab, bos_id, eos_ids = _save_tokenizer(folder, style)
    # Real checkpoints pad the embedding past the tokenizer's vocabulary; so do these.
    vocab_size = -(-tokenizer_vocab // 64) * 64
    config = config_class(
        **{**_SIZES, **extra, **(sizes or {})},
        vocab_size=vocab_size,
        bos_token_id=bos_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder, max_shard_size=150_000 if sharded else "10GB")
    return folder


_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, verbatim in effect."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _k_mix(main: str, more: str):
    """llama.cpp's K-quant mixes in small: attn_v and ffn_down of the first layer (one of the
    layers its use_more_bits picks) and the LM head in `more`, every other 2-D tensor in `main`."""

    def type_of(gguf_name: str) -> str:
        wider = gguf_name in ("blk.0.attn_v.weight", "blk.0.ffn_down.weight", "output.weight")
        return more if wider else main

    return type_of


MIXES = {"Q4_K_M": _k_mix("Q4_K", "Q6_K"), "Q5_K_M": _k_mix("Q5_K", "Q6_K")}


def build_tiny_gguf(hf_folder: str | Path, path: str | Path, ggml_type: str = "F32") -> Path:
    import gguf  # only here: the tiny Hugging Face folders need no gguf installed

    hf_folder, path = Path(hf_folder), Path(path)
    config = json.loads((hf_folder / "config.json").read_text())
    arch = "qwen2" if config["model_type"] == "qwen2" else "llama"
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(
        config["head_dim"] if "head_dim" in config else config["hidden_size"] // heads
    )

    tokenizer = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer["added_tokens"]}}
    special = {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = [f"[PAD{i}]" for i in range(config["vocab_size"])]
    for token, i in vocab.items():
        tokens[i] = token
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 5 if i >= len(vocab) else 1 for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    eos = config["eos_token_id"]
    writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    writer.add_add_bos_token(tokenizer.get("post_processor") is not None)
    writer.add_chat_template((hf_folder / "chat_template.jinja").read_text())

    for name, tensor in _hf_tensors(hf_folder).items():
        data = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            gguf_name = "output.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{_GGUF_LAYER_NAMES[rest]}"
            if arch == "llama" and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                data = _llama_cpp_permute(data, heads if "q_proj" in rest else kv_heads)
        stored = MIXES[ggml_type](gguf_name) if ggml_type in MIXES else ggml_type
        quantized = gguf.GGMLQuantizationType[stored]
        if data.ndim == 2 and stored in K_QUANTIZERS:
            writer.add_tensor(gguf_name, K_QUANTIZERS[stored](data), raw_dtype=quantized)
        elif data.ndim == 2 and stored != "F32":
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, quantized), raw_dtype=quantized)
        else:
            writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
