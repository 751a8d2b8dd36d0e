"""Whether a variant's model fits its pods, from the spec alone (pagoda_runtime.sizing does the bytes)."""

from __future__ import annotations

from kubernetes.utils import parse_quantity
from pagoda_runtime.quantization_selection import select_quantization
from pagoda_runtime.sizing import FitResult, fits

from pagoda_operator.models import InferenceServiceSpec, VariantSpec


def capacity_bytes(spec: InferenceServiceSpec) -> int | None:
    """Memory the model must fit in: one GPU's memory, or the pod's memory on the CPU."""
    quantity = spec.resources.gpu_memory if spec.resources.gpus else spec.resources.memory
    return None if quantity is None else int(parse_quantity(str(quantity)))


def sized_quantization(spec: InferenceServiceSpec, variant: VariantSpec) -> str:
    """The method the runtime will build the variant's projections with, as far as the spec tells.

    The spec says a checkpoint is GGUF by its source; any other source is taken for float weights
    unless the variant names awq or gptq, so a 4-bit folder is sized exactly only when named.
    """
    stored = "gguf" if spec.model.is_gguf else None
    if variant.quantization in ("awq", "gptq"):
        stored = variant.quantization
    device_type = "cuda" if spec.resources.gpus else "cpu"
    return select_quantization(variant.quantization, stored, device_type, spec.model.source)


def variant_fit(spec: InferenceServiceSpec, variant: VariantSpec) -> FitResult | None:
    """None when the spec lacks the architecture or the capacity needed to decide."""
    arch = spec.model.sizing_architecture()
    capacity = capacity_bytes(spec)
    if arch is None or capacity is None:
        return None
    max_model_len = spec.model.max_model_len or arch.max_position_embeddings
    return fits(
        arch, sized_quantization(spec, variant), max_model_len, capacity, kv_dtype=variant.kv_cache_dtype
    )
