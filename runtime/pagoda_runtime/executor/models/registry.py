"""The model families Pagoda serves: the one place a family is added.

Each family names the Hugging Face architectures it serves, its model class, how it reads a
config.json, the tensors its checkpoints hold, and (where llama.cpp writes it) how it reads a GGUF
file's metadata and tensor names. The loaders, the random-weight models, the model runner and the
README's table of supported models all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.models import (
    apertus,
    arcee,
    cohere,
    deepseek,
    ernie,
    exaone4,
    gemma,
    glm4,
    glm4_moe,
    gpt_oss,
    granite,
    granite_moe,
    lfm2,
    llama,
    llama4,
    minimax_m2,
    moe,
    nemotron,
    nemotron_h,
    olmo2,
    olmoe,
    phi3,
    qwen3,
    qwen3_next,
)
from pagoda_runtime.executor.models.decoder import CausalLM, Weight

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class GGUFLayout:
    """How llama.cpp writes a family: its general.architecture names, the ModelConfig its metadata
    gives (arch, metadata, tensor names, a reader of a tensor's values), and its per-layer tensor
    names beyond the shared ones (blk.N.<gguf name> -> model.layers.N.<Hugging Face name>)."""

    architectures: tuple[str, ...]
    config: Callable[[str, dict[str, Any], set[str], Callable], ModelConfig]
    layer_names: dict[str, str] = field(default_factory=dict)
    # The architectures whose q and k rows llama.cpp's converter interleaves per head for its RoPE
    # (its LLaMA converter); the loader undoes it.
    permuted_qk: tuple[str, ...] = ()
    # (Hugging Face name, tensor as stored) -> the tensor the model takes, where llama.cpp stores it
    # otherwise.
    tensor: Callable[[str, Weight], Weight] | None = None


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # config.json "architectures" it serves
    model_types: tuple[str, ...]  # ModelConfig.model_type of its configs
    model: type[CausalLM]
    # (raw config.json, the architecture named there) -> ModelConfig; raises hf_config.ConfigError.
    config_from_hf: Callable[[dict[str, Any], str], ModelConfig]
    weight_shapes: Callable[[ModelConfig], Shapes]
    gguf: GGUFLayout | None = None
    # How the projections can be held (README's table): float, quantized online, or as stored.
    quantizations: tuple[str, ...] = ("none", "int8", "int4", "fp8", "awq", "gptq", "gguf")
    # Module path fragments its checkpoints and PEFT adapters name otherwise than the Llama layout
    # (".feed_forward.w1." for ".mlp.gate_proj."), where LoRA adapters are read.
    adapter_names: dict[str, str] = field(default_factory=dict)


FAMILIES: tuple[Family, ...] = (
    Family(
        name="Llama",
        architectures=tuple(llama.MODEL_TYPES),
        model_types=tuple(llama.MODEL_TYPES.values()),
        model=llama.LlamaForCausalLM,
        config_from_hf=llama.config_from_hf,
        weight_shapes=llama.weight_shapes,
        gguf=GGUFLayout(("llama", "qwen2"), llama.config_from_gguf, permuted_qk=("llama",)),
    ),
    Family(
        name="Llama 4",
        architectures=("Llama4ForCausalLM",),
        model_types=("llama4",),
        model=llama4.Llama4ForCausalLM,
        config_from_hf=llama4.config_from_hf,
        weight_shapes=llama4.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8"),
    ),
    Family(
        name="Arcee AFM",
        architectures=("ArceeForCausalLM",),
        model_types=("arcee",),
        model=arcee.ArceeForCausalLM,
        config_from_hf=arcee.config_from_hf,
        weight_shapes=llama.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Apertus",
        architectures=("ApertusForCausalLM",),
        model_types=("apertus",),
        model=apertus.ApertusForCausalLM,
        config_from_hf=apertus.config_from_hf,
        weight_shapes=apertus.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Nemotron",
        architectures=("NemotronForCausalLM",),
        model_types=("nemotron",),
        model=nemotron.NemotronForCausalLM,
        config_from_hf=nemotron.config_from_hf,
        weight_shapes=nemotron.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Qwen3.5 / Qwen3-Next",
        architectures=tuple(qwen3_next.MODEL_TYPES),
        model_types=tuple(qwen3_next.MODEL_TYPES.values()),
        model=qwen3_next.Qwen3NextForCausalLM,
        config_from_hf=qwen3_next.config_from_hf,
        weight_shapes=qwen3_next.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8"),
    ),
    Family(
        name="LFM2",
        architectures=("Lfm2ForCausalLM",),
        model_types=("lfm2",),
        model=lfm2.Lfm2ForCausalLM,
        config_from_hf=lfm2.config_from_hf,
        weight_shapes=lfm2.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8"),
        adapter_names=lfm2.MODULE_NAMES,
    ),
    Family(
        name="Nemotron-H / Nemotron Nano 2",
        architectures=("NemotronHForCausalLM",),
        model_types=("nemotron_h",),
        model=nemotron_h.NemotronHForCausalLM,
        config_from_hf=nemotron_h.config_from_hf,
        weight_shapes=nemotron_h.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8"),
        # Its attention's projections sit in each layer's mixer (an adapter's MLP targets refused).
        adapter_names={".mixer.": ".self_attn."},
    ),
    Family(
        name="Granite 3",
        architectures=("GraniteForCausalLM",),
        model_types=("granite",),
        model=granite.GraniteForCausalLM,
        config_from_hf=granite.config_from_hf,
        weight_shapes=llama.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Granite MoE / Granite 4",
        architectures=tuple(granite_moe.MODEL_TYPES),
        model_types=tuple(granite_moe.MODEL_TYPES.values()),
        model=granite_moe.GraniteMoeForCausalLM,
        config_from_hf=granite_moe.config_from_hf,
        weight_shapes=granite_moe.weight_shapes,
        # Fused experts: quantized at load, never read packed.
        quantizations=("none", "int8", "int4", "fp8"),
    ),
    Family(
        name="Qwen3",
        architectures=("Qwen3ForCausalLM",),
        model_types=("qwen3",),
        model=qwen3.Qwen3ForCausalLM,
        config_from_hf=qwen3.config_from_hf,
        weight_shapes=qwen3.weight_shapes,
        gguf=GGUFLayout(("qwen3",), qwen3.config_from_gguf, qwen3.GGUF_NAMES),
    ),
    Family(
        name="Qwen3-MoE",
        architectures=("Qwen3MoeForCausalLM",),
        model_types=("qwen3_moe", "qwen3_vl_moe"),
        model=moe.Qwen3MoeForCausalLM,
        config_from_hf=moe.qwen3_moe_config_from_hf,
        weight_shapes=moe.weight_shapes,
        gguf=GGUFLayout(("qwen3moe",), moe.qwen3_moe_config_from_gguf, moe.QWEN3_MOE_GGUF_NAMES),
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq", "gguf"),
    ),
    Family(
        name="Qwen2-MoE",
        architectures=("Qwen2MoeForCausalLM",),
        model_types=("qwen2_moe",),
        model=moe.Qwen2MoeForCausalLM,
        config_from_hf=moe.qwen2_moe_config_from_hf,
        weight_shapes=moe.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Mixtral",
        architectures=("MixtralForCausalLM",),
        model_types=("mixtral",),
        model=moe.MixtralForCausalLM,
        config_from_hf=moe.mixtral_config_from_hf,
        weight_shapes=moe.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="GPT-OSS",
        architectures=("GptOssForCausalLM",),
        model_types=("gpt_oss",),
        model=gpt_oss.GptOssForCausalLM,
        config_from_hf=gpt_oss.config_from_hf,
        weight_shapes=gpt_oss.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8"),
    ),
    Family(
        name="Gemma 2",
        architectures=("Gemma2ForCausalLM",),
        model_types=("gemma2",),
        model=gemma.Gemma2ForCausalLM,
        config_from_hf=gemma.config_from_hf,
        weight_shapes=gemma.weight_shapes,
        gguf=GGUFLayout(("gemma2",), gemma.config_from_gguf, gemma.GGUF_NAMES, tensor=gemma.gguf_tensor),
    ),
    Family(
        name="Gemma 3 (text)",
        architectures=("Gemma3ForCausalLM",),
        model_types=("gemma3_text",),
        model=gemma.Gemma3ForCausalLM,
        config_from_hf=gemma.config_from_hf,
        weight_shapes=gemma.weight_shapes,
        gguf=GGUFLayout(("gemma3",), gemma.config_from_gguf, gemma.GGUF_NAMES, tensor=gemma.gguf_tensor),
    ),
    Family(
        name="OLMo 2 / OLMo 3",
        architectures=tuple(olmo2.MODEL_TYPES),
        model_types=tuple(olmo2.MODEL_TYPES.values()),
        model=olmo2.Olmo2ForCausalLM,
        config_from_hf=olmo2.config_from_hf,
        weight_shapes=olmo2.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Command R / R7B / A",
        architectures=tuple(cohere.MODEL_TYPES),
        model_types=tuple(cohere.MODEL_TYPES.values()),
        model=cohere.CohereForCausalLM,
        config_from_hf=cohere.config_from_hf,
        weight_shapes=cohere.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="GLM-4",
        architectures=("Glm4ForCausalLM",),
        model_types=("glm4",),
        model=glm4.Glm4ForCausalLM,
        config_from_hf=glm4.config_from_hf,
        weight_shapes=glm4.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="GLM-4.5 / GLM-4.6",
        architectures=("Glm4MoeForCausalLM",),
        model_types=("glm4_moe",),
        model=glm4_moe.Glm4MoeForCausalLM,
        config_from_hf=glm4_moe.config_from_hf,
        weight_shapes=glm4_moe.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="dots.llm1",
        architectures=("Dots1ForCausalLM",),
        model_types=("dots1",),
        model=glm4_moe.Glm4MoeForCausalLM,
        config_from_hf=glm4_moe.config_from_hf,
        weight_shapes=glm4_moe.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="OLMoE",
        architectures=("OlmoeForCausalLM",),
        model_types=("olmoe",),
        model=olmoe.OlmoeForCausalLM,
        config_from_hf=olmoe.config_from_hf,
        weight_shapes=olmoe.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="DeepSeek V2 / V3",
        architectures=tuple(deepseek.MODEL_TYPES),
        model_types=tuple(deepseek.MODEL_TYPES.values()),
        model=deepseek.DeepseekForCausalLM,
        config_from_hf=deepseek.config_from_hf,
        weight_shapes=deepseek.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="ERNIE 4.5",
        architectures=tuple(ernie.MODEL_TYPES),
        model_types=tuple(ernie.MODEL_TYPES.values()),
        model=ernie.ErnieForCausalLM,
        config_from_hf=ernie.config_from_hf,
        weight_shapes=ernie.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="EXAONE 4.0",
        architectures=("Exaone4ForCausalLM",),
        model_types=("exaone4",),
        model=exaone4.Exaone4ForCausalLM,
        config_from_hf=exaone4.config_from_hf,
        weight_shapes=exaone4.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="MiniMax-M2",
        architectures=("MiniMaxM2ForCausalLM",),
        model_types=("minimax_m2",),
        model=minimax_m2.MiniMaxM2ForCausalLM,
        config_from_hf=minimax_m2.config_from_hf,
        weight_shapes=minimax_m2.weight_shapes,
        quantizations=("none", "int8", "int4", "fp8", "awq", "gptq"),
    ),
    Family(
        name="Phi-3 / Phi-4-mini",
        architectures=("Phi3ForCausalLM",),
        model_types=("phi3",),
        model=phi3.Phi3ForCausalLM,
        config_from_hf=phi3.config_from_hf,
        weight_shapes=phi3.weight_shapes,
        gguf=GGUFLayout(("phi3",), phi3.config_from_gguf, phi3.GGUF_NAMES),
    ),
)

HF_ARCHITECTURES: dict[str, Family] = {a: f for f in FAMILIES for a in f.architectures}
GGUF_ARCHITECTURES: dict[str, Family] = {a: f for f in FAMILIES if f.gguf for a in f.gguf.architectures}
_BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}


def family_of(config: ModelConfig) -> Family:
    if config.model_type not in _BY_MODEL_TYPE:
        raise ValueError(
            f"no model family builds model_type {config.model_type!r}; known: {', '.join(_BY_MODEL_TYPE)}"
        )
    return _BY_MODEL_TYPE[config.model_type]


def weight_shapes(config: ModelConfig) -> Shapes:
    """Every tensor a checkpoint of `config` holds, by Hugging Face name, with its shape."""
    return family_of(config).weight_shapes(config)


def build_model(config: ModelConfig, *args, **kwargs) -> CausalLM:
    """The family's model for `config`; the arguments are CausalLM's."""
    return family_of(config).model(config, *args, **kwargs)
