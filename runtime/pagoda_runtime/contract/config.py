"""Typed configuration: the model's architecture and the engine's limits.

Both are plain data built once at the edge (CLI flags, config.json, GGUF metadata) and read
everywhere else; nothing inside the engine parses strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pagoda_runtime.contract.bundled import BUNDLED_MODEL_NAME
from pagoda_runtime.contract.flags import setting
from pagoda_runtime.contract.lora_modules import checked_lora_module
from pagoda_runtime.contract.names import LWS_GROUP_SIZE, LWS_VARIABLES
from pagoda_runtime.contract.pooling import RUNNERS, Classifier, Matryoshka, PoolerConfig, parse_pooler_config
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.speculative import SpeculativeConfig, parse_speculative_config

# How the decoder projections are held; --quantization auto picks one from the checkpoint
# (quantization_selection.py).
QUANTIZATION_METHODS = ("none", "int8", "int4", "fp8", "awq", "gptq", "gguf")
QUANTIZATION_CHOICES = ("auto", *QUANTIZATION_METHODS)
# Activation and unquantized weight dtypes; auto: bfloat16 on a GPU, float32 on a CPU.
DTYPES = ("auto", "float32", "float16", "bfloat16")
# auto: the model's dtype; fp8: e4m3, half the bytes of bf16.
KV_CACHE_DTYPES = ("auto", "fp8")
# auto: read the checkpoint --model names; dummy: random weights of the model shape --model names
# (model_catalogue.SHAPES), vLLM's flag of the same name.
LOAD_FORMATS = ("auto", "dummy")
# vLLM's --scheduling-policy: fcfs serves in arrival order; priority by each request's `priority`
# (lower first, with ageing: engine/priority.py).
SCHEDULING_POLICIES = ("fcfs", "priority")


# Hugging Face rope_scaling types the rotary table (kernels/rope_cache.py) implements.
ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1 style frequency scaling ("rope_type": "llama3"), linear scaling, LongRoPE (Phi-3:
    short_factor up to original_max_position_embeddings, long_factor past it), or YaRN (Qwen 2.5
    and 3 past 32K, DeepSeek: frequencies blended between interpolated and kept by a ramp from
    beta_fast to beta_slow rotations, cos and sin scaled by attention_factor)."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None  # LongRoPE's and YaRN's cos/sin scale; None: from factor
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # YaRN's default attention_factor is mscale's over mscale_all_dim's where both are set (DeepSeek).
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True  # YaRN: the ramp's ends rounded to whole dimensions

    def yarn_mscale(self, m: float = 1.0) -> float:
        """YaRN's magnitude correction for stretching by `factor`, 0.1 m ln(factor) + 1 (1 unstretched)."""
        return 1.0 if self.factor <= 1 else 0.1 * m * math.log(self.factor) + 1.0


def latent_softmax_scale(head_dim: int, scaling: RopeScaling | None) -> float:
    """head_dim ** -0.5, times the square of YaRN's mscale over all dimensions where the scaling sets
    mscale_all_dim (DeepSeek's latent attention; transformers' yarn_apply_mscale)."""
    scale = head_dim**-0.5
    if scaling is not None and scaling.mscale_all_dim:
        scale *= scaling.yarn_mscale(scaling.mscale_all_dim) ** 2
    return scale


# The norm weights of families whose decoder layers hold more than Llama's two: (norms of
# hidden_size per layer, per-head query and key norms). Set on the architecture here, the one place
# every family's config (config.json, GGUF, the catalogue) passes, so that sizing counts them.
_FAMILY_NORMS = {
    "gemma2": (4, False),
    "gemma3_text": (4, True),
    "qwen3": (2, True),
    "qwen3_moe": (2, True),
    "qwen3_vl_moe": (2, True),
    "cohere": (1, False),
    "cohere2": (1, False),
    "glm4": (4, False),
    "apertus": (2, True),
    "nemotron_h": (1, False),
    "qwen3_5": (2, True),
    "qwen3_5_moe": (2, True),
    "qwen3_next": (2, True),
    "lfm2": (2, True),
}
# Families whose checkpoints store q, k and v as one tensor (a GGUF mix quantizes it as one).
_FUSED_QKV = {"phi3"}
# Families whose q and k norms span all heads (their weights as wide as q and k).
_WIDE_QK_NORM = {"olmo2", "olmo3", "olmoe", "minimax_m2"}
# Families with attention sinks, an attention output bias, and biased routers and experts.
_SINKS_AND_BIASES = {"gpt_oss"}
# Families whose MLP is ungated (up and down only), with the learned numbers of its activation.
_UNGATED_MLP = {"arcee": 0, "nemotron": 0, "apertus": 4, "nemotron_h": 0}
# Families whose norms hold a bias (Nemotron's LayerNorm1P).
_NORM_BIAS = {"nemotron"}


@dataclass(frozen=True)
class AttentionTemperature:
    """Llama 4's attention temperature tuning (attn_temperature_tuning): in the layers without rotary
    embeddings, the query at position p is scaled by 1 + attn_scale * log(1 + floor((p + 1) /
    floor_scale)), so that attention stays sharp over long contexts."""

    floor_scale: float
    attn_scale: float


@dataclass(frozen=True)
class ModelConfig:
    """What the runtime builds a model from: its architecture (the shape, all that sizing reads) and
    what only the computation needs, under config.json's names."""

    # The family's model type: llama, qwen3, gemma2, ... (executor/models/registry.py lists them
    # with the model class each maps to).
    model_type: str
    architecture: ModelArchitecture
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # The sliding-window layers' own unscaled RoPE base where their RoPE differs (Gemma 3: 10000;
    # OLMo 3: rope_theta, unscaled, while its full layers take YaRN).
    local_rope_theta: float | None = None
    # The share of each head's dimensions that is rotated (Phi-4-mini: 0.75).
    partial_rotary_factor: float = 1.0
    # Attention scores scaled by query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5 (Gemma).
    query_pre_attn_scalar: float | None = None
    # tanh soft-caps: scores = cap * tanh(scores / cap) (Gemma 2).
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # Mixture of experts: the chosen experts' router weights rescaled to sum to one.
    norm_topk_prob: bool = False
    # Mixture-of-experts routing by sigmoid scores (GLM-4.5, DeepSeek V3): each expert's score plus its
    # correction bias chooses, within the topk_group of n_group groups whose two best scores sum
    # highest; the chosen experts' plain scores, renormalized where norm_topk_prob says, times
    # routed_scaling_factor, weigh them. softmax: the top-k of the softmax (Qwen3-MoE, Mixtral), within
    # the topk_group of n_group groups whose best expert scores highest where n_group > 1 (DeepSeek
    # V2's group_limited_greedy), their sum times routed_scaling_factor (DeepSeek V2).
    scoring_func: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # GPT-OSS's experts: gate clamped above and up on both sides at this value before their clamped
    # SwiGLU (kernels/moe_activation.py); None: the plain SiLU-gated experts.
    swiglu_limit: float | None = None
    # Layers that attend without rotary embeddings (SmolLM3's NoPE layers, every fourth).
    no_rope_layers: tuple[int, ...] = ()
    # Rotary pairs are neighbouring dimensions (2i, 2i + 1) rather than the two halves (Cohere, GLM-4).
    rope_interleaved: bool = False
    # Llama 4's: q and k normed per head without weights (an L2 norm) in the layers that rotate; the
    # queries of the layers that do not rotate scaled by their position (AttentionTemperature); each
    # token's input to its one expert scaled by the router's weight instead of the expert's output.
    qk_l2_norm: bool = False
    attn_temperature: AttentionTemperature | None = None
    router_weight_on_input: bool = False
    # Granite's scalars: attention scores scaled by attention_multiplier (instead of head_dim ** -0.5),
    # embeddings times embedding_multiplier, each attention and MLP output times residual_multiplier
    # before it joins the residual stream, logits divided by logits_scaling (also Cohere's, as
    # 1 / logit_scale).
    attention_multiplier: float | None = None
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # An embedding model's Matryoshka sizes (contract/pooling.py); None: its embeddings are not cut.
    matryoshka: Matryoshka | None = None
    # A sequence classifier's head (contract/pooling.py); None: the model embeds or generates.
    classifier: Classifier | None = None

    @property
    def context_length(self) -> int:
        """The longest sequence the model serves without --max-model-len: its trained context, or
        with YaRN that context stretched by the factor (vLLM's rule)."""
        scaling = self.rope_scaling
        if scaling is not None and scaling.rope_type == "yarn":
            return int(scaling.original_max_position_embeddings * scaling.factor)
        return self.architecture.max_position_embeddings

    @property
    def attention_scale(self) -> float:
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return (self.query_pre_attn_scalar or self.architecture.head_dim) ** -0.5

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that are rotated: the first rotary_dim, in pairs
        (i, i + rotary_dim / 2)."""
        return int(self.architecture.head_dim * self.partial_rotary_factor)

    def __post_init__(self) -> None:
        if self.model_type in _FAMILY_NORMS:
            per_layer, qk_norm = _FAMILY_NORMS[self.model_type]
            architecture = replace(self.architecture, norms_per_layer=per_layer, qk_norm=qk_norm)
            object.__setattr__(self, "architecture", architecture)
        if self.model_type in _FUSED_QKV:
            object.__setattr__(self, "architecture", replace(self.architecture, fused_qkv=True))
        if self.model_type in _WIDE_QK_NORM:
            object.__setattr__(self, "architecture", replace(self.architecture, wide_qk_norm=True))
        if self.model_type in _UNGATED_MLP:
            architecture = replace(
                self.architecture, gated_mlp=False, activation_parameters=_UNGATED_MLP[self.model_type]
            )
            object.__setattr__(self, "architecture", architecture)
        if self.model_type in _NORM_BIAS:
            object.__setattr__(self, "architecture", replace(self.architecture, norm_bias=True))
        if self.model_type in _SINKS_AND_BIASES:
            architecture = replace(
                self.architecture, attention_sinks=True, attention_output_bias=True, expert_bias=True
            )
            object.__setattr__(self, "architecture", architecture)


def parse_hf_overrides(value: str | Mapping[str, Any]) -> dict[str, Any]:
    """--hf-overrides as a JSON string, or LLM(hf_overrides=...) as a mapping: a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--hf-overrides is not valid JSON ({exc}); give a JSON object") from exc
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            '--hf-overrides must be a non-empty JSON object such as {"max_position_embeddings": 65536}'
        )
    return dict(value)


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings; each field is also a `serve` flag (flags.py) and, where an
    InferenceService sets it, a field of its spec.runtime with this default and help."""

    model: str = setting(
        BUNDLED_MODEL_NAME,
        "model folder, .gguf file, 'smollm2-135m', or a Hugging Face hub id org/name[@revision] "
        "(downloaded into the Hugging Face cache first, as vLLM does); with --load-format dummy a model "
        "shape",
    )
    load_format: str = setting(
        "auto",
        "auto: read the checkpoint --model names; dummy: random weights of the model shape --model "
        "names (llama-3-8b, tiny-llama, ...: model_catalogue.py) with a bare tokenizer, for benchmarks",
        choices=LOAD_FORMATS,
    )
    dtype: str = setting(
        "auto",
        "activation and unquantized weight dtype; auto: bfloat16 on a GPU, float32 on a CPU",
        choices=DTYPES,
    )
    device: str = setting("auto", "auto (a GPU when there is one), cpu, cuda or cuda:N")
    quantization: str = setting(
        "auto",
        "how to hold the projections; auto serves the checkpoint as it was saved "
        "(what it picks: docs/architecture.md#quantization)",
        choices=QUANTIZATION_CHOICES,
    )
    kv_cache_dtype: str = setting(
        "auto",
        "auto: the model's dtype; fp8: e4m3 with a per-tensor scale of 1.0, half the bytes of bf16",
        choices=KV_CACHE_DTYPES,
    )
    max_model_len: int | None = setting(
        None, "longest prompt plus completion in tokens (default: the model's own limit)"
    )
    max_num_seqs: int = setting(256, "most sequences batched together per step")
    max_num_batched_tokens: int = setting(
        8192, "token budget of one engine step (prompt chunks and decoded tokens together)"
    )
    scheduling_policy: str = setting(
        "fcfs",
        "fcfs: requests are served in arrival order; priority: by the request field priority (lower "
        "first, ties by arrival, waiting time ages a request up: docs/architecture.md#priority-scheduling)",
        choices=SCHEDULING_POLICIES,
    )
    block_size: int = setting(16, "tokens per KV cache block")
    kv_cache_memory: float = setting(
        0.9, "KV cache size: bytes, or a fraction (0, 1] of the free device memory"
    )
    gpu_memory_utilization: float | None = setting(
        None,
        "vLLM's budget instead of --kv-cache-memory: the fraction (0, 1] of the GPU's total memory "
        "for this process; the KV cache gets what the weights leave of it",
    )
    enable_prefix_caching: bool = setting(True, "reuse KV blocks of shared prompt prefixes")
    enable_chunked_prefill: bool = setting(
        True,
        "split long prompts into steps of --max-num-batched-tokens beside running decodes (vLLM's flag; "
        "always on here, so --no-enable-chunked-prefill is refused)",
    )
    trust_remote_code: bool = setting(
        False,
        "accepted for vLLM command lines: Pagoda serves the architectures it implements itself and runs "
        "no code from a model's repository, so there is nothing to trust",
    )
    enforce_eager: bool = setting(False, "do not capture CUDA graphs")
    async_scheduling: bool | None = setting(
        None,
        "schedule and launch each step before reading the previous step's tokens, and make their text "
        "while the device runs (vLLM's async scheduling); default: on where the device runs apart from "
        "the host (a GPU), off on a CPU, which computes in the launch and gains nothing",
        off="--disable-async-output-proc",
    )
    speculative_config: SpeculativeConfig | None = setting(
        None,
        'vLLM\'s speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4}\' or \'{"model": "<draft>", "num_speculative_tokens": 4}\': n-gram '
        "prompt lookup or a draft model of the target's tokenizer drafts tokens that one step verifies, "
        "the output distribution unchanged (docs/architecture.md#speculative-decoding); default: off",
        parse=parse_speculative_config,
    )
    runner: str = setting(
        "auto",
        "generate: the model writes tokens; pooling: it pools each prompt instead, into an embedding "
        "(POST /v1/embeddings, LLM.embed; embedding models such as Qwen3-Embedding) or a sequence "
        "classifier's scores (POST /score, /rerank, /classify; rerankers such as Qwen3-Reranker); auto: "
        "generate (vLLM's flag; vLLM's choice for the causal architectures served here)",
        choices=RUNNERS,
    )
    pooler_config: PoolerConfig | None = setting(
        None,
        'under --runner pooling, how hidden states become the embedding, as JSON: \'{"pooling_type": '
        '"MEAN", "normalize": false}\' (LAST, MEAN or CLS); default: the model folder\'s '
        "sentence-transformers config, else LAST, normalized (docs/architecture.md#embeddings)",
        parse=parse_pooler_config,
    )
    hf_overrides: dict[str, Any] | None = setting(
        None,
        "JSON object whose keys replace the model's config.json ones, as vLLM's flag: e.g. "
        '\'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": '
        "32768}}' serves Qwen 3 at four times its context; Hugging Face folders only",
        parse=parse_hf_overrides,
    )
    seed: int = setting(
        0, "seed of the sampler (for requests without a seed of their own) and of random weights"
    )
    tensor_parallel_size: int = setting(
        1,
        "ranks (GPUs) the model is split over, one process each; under LeaderWorkerSet "
        f"({', '.join(LWS_VARIABLES)} set) they span the group's pods, N / {LWS_GROUP_SIZE} per pod",
        short="-tp",
    )
    enable_lora: bool = setting(
        False, "serve LoRA adapters of the model (--lora-modules, /v1/load_lora_adapter)"
    )
    lora_modules: tuple[str, ...] = setting(
        (),
        "LoRA adapters served from the start, each name=path (a PEFT folder, hf://org/name[@revision] or "
        "s3://bucket/prefix) or vLLM's JSON "
        '{"name": ..., "path": ..., "base_model_name": ...}; a request names one as its model',
        many=True,
        parse=checked_lora_module,
    )
    max_loras: int = setting(1, "LoRA adapters resident on the device at once, hence in one step")
    max_lora_rank: int = setting(16, "largest LoRA rank an adapter may have")
    max_cpu_loras: int | None = setting(
        None, "LoRA adapters kept in host memory, least recently used evicted (default: --max-loras)"
    )
    download_dir: str | None = setting(
        None,
        "folder that hf://org/name[@revision] and s3://bucket/prefix LoRA adapters are downloaded into, "
        "once per source and revision (default: ~/.cache/pagoda; hub ids of --model go to the Hugging "
        "Face cache)",
    )

    @property
    def pooling(self) -> bool:
        """Whether the engine embeds prompts (--runner pooling) rather than generating."""
        return self.runner == "pooling"

    def __post_init__(self) -> None:
        if self.pooler_config is not None and not self.pooling:
            raise ValueError("--pooler-config applies to --runner pooling; add that flag or drop this one")
        if self.pooling and self.speculative_config is not None:
            raise ValueError(
                "--runner pooling embeds prompts and generates no tokens to speculate on; drop "
                "--speculative-config"
            )
        if self.pooling:
            # A cached prefix is not run again, and mean or first-token pooling needs its hidden
            # states (vLLM turns it off for such pooling too); the start-up banner shows it off.
            object.__setattr__(self, "enable_prefix_caching", False)
        if not self.enable_chunked_prefill:
            raise ValueError(
                "--no-enable-chunked-prefill is not supported: Pagoda always splits long prompts into steps "
                "of --max-num-batched-tokens; drop the flag"
            )
