"""Reading the fields of a Hugging Face config.json that every family shares.

A family's parser (in its module) reads its own fields and calls these for the rest; a missing
field the family needs is named in one sentence (ConfigFieldMissing), never a bare KeyError.
"""

from __future__ import annotations

from typing import Any

from pagoda_runtime.contract.config import ROPE_TYPES, RopeScaling


class ConfigError(ValueError):
    """A config.json the family cannot be built from; the loader names the file."""


def field(raw: dict[str, Any], name: str, family: str) -> Any:
    if raw.get(name) is None:
        raise ConfigError(f"lacks {name!r}, which a {family} model needs; restore the field in config.json")
    return raw[name]


def architecture_fields(raw: dict[str, Any], family: str) -> dict[str, Any]:
    """The ModelArchitecture fields every decoder has, under their config.json names."""
    heads = field(raw, "num_attention_heads", family)
    hidden = field(raw, "hidden_size", family)
    return dict(
        num_hidden_layers=field(raw, "num_hidden_layers", family),
        hidden_size=hidden,
        intermediate_size=field(raw, "intermediate_size", family),
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        vocab_size=field(raw, "vocab_size", family),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
    )


def nextn_predict_layers(raw: dict[str, Any]) -> dict[str, int]:
    """The multi-token-prediction layers a DeepSeek V3 or GLM-4.5 checkpoint holds after its decoder
    layers (models/mtp_head.py), as ModelArchitecture's field."""
    layers = raw.get("num_nextn_predict_layers") or 0
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise ConfigError(
            f"has num_nextn_predict_layers {layers!r}; set it to a count of layers (0 for none)"
        )
    return {"num_nextn_predict_layers": layers}


def rope_parameters(raw: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes rope_parameters (per layer type for some families); older configs have
    rope_theta and rope_scaling. A scaled type without original_max_position_embeddings takes the
    config's, as transformers does."""
    params = {k: dict(v) if isinstance(v, dict) else v for k, v in (raw.get("rope_parameters") or {}).items()}
    params.update(raw.get("rope_scaling") or {})
    if "rope_theta" in raw:
        params.setdefault("rope_theta", raw["rope_theta"])
    context = raw.get("max_position_embeddings")
    for scaled in (params, *(params[t] for t in LAYER_TYPES if isinstance(params.get(t), dict))):
        if scaled.get("rope_type", scaled.get("type")) in ("llama3", "yarn") and context is not None:
            scaled.setdefault("original_max_position_embeddings", context)
    return params


def rope_scaling(params: dict[str, Any], family: str) -> RopeScaling | None:
    """The frequency scaling `params` (rope_parameters) asks for; None for plain RoPE."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"asks for rope scaling {rope_type!r}, which Pagoda does not implement for {family} "
            f"models; it implements {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return None
    fields = (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    )
    if rope_type == "yarn" and params.get("factor") is None:
        raise ConfigError(f"asks for yarn rope scaling without its factor, which {family} models need")
    return RopeScaling(rope_type, **{k: params[k] for k in fields if params.get(k) is not None})


def attention_biases(raw: dict[str, Any]) -> dict[str, bool]:
    """The ModelArchitecture bias fields of a family whose attention_bias biases q, k, v and o alike
    (transformers' Llama layout: Llama, Granite, Qwen3, Qwen3-MoE, OLMo, Cohere, Gemma)."""
    bias = bool(raw.get("attention_bias", False))
    return {"attention_bias": bias, "attention_output_bias": bias}


def check_activation(raw: dict[str, Any], key: str, expected: str, family: str) -> None:
    if raw.get(key, expected) != expected or raw.get("mlp_bias", False):
        raise ConfigError(
            f"asks for {key}={raw.get(key)!r}, mlp_bias={raw.get('mlp_bias', False)}; Pagoda's {family} "
            f"models have the {expected} MLP without bias"
        )


LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_types(raw: dict[str, Any], num_layers: int, family: str, per_layer: bool) -> dict[str, Any]:
    """The ModelArchitecture fields sliding_window and layer_types a config implies.

    per_layer: the Qwen2/Qwen3 rule, where use_sliding_window turns the window on and layers from
    max_window_layers on slide (or config.json lists layer_types); otherwise a sliding_window
    applies to every layer (Mistral, Mixtral, Phi-3) unless layer_types says which.
    """
    window = raw.get("sliding_window")
    if per_layer and not raw.get("use_sliding_window", False):
        window = None
    if not window:
        return {}
    types = raw.get("layer_types")
    if types is None and per_layer:
        first = raw.get("max_window_layers", 0)
        types = [LAYER_TYPES[i >= first] for i in range(num_layers)]
    if types is None:
        return {"sliding_window": window}
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown or len(types) != num_layers:
        raise ConfigError(
            f"has layer_types {unknown or types!r}; a {family} model needs one of {', '.join(LAYER_TYPES)} "
            f"for each of its {num_layers} layers"
        )
    if "sliding_attention" not in types:
        return {}
    return {"sliding_window": window, "layer_types": tuple(types)}
