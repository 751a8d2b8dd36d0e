"""Each variant's plan, decided once from the spec and handed to render and status: the method its
runtime will build the projections with, whether its model splits over its tensor-parallel ranks and
fits their GPUs, and so whether it gets pods. pagoda_runtime.contract.quantization_selection and
pagoda_runtime.contract.sizing own the rules; this applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kubernetes.utils import parse_quantity
from pagoda_runtime.contract.eagle_sizing import EagleHeadShape
from pagoda_runtime.contract.quantization_selection import select_quantization
from pagoda_runtime.contract.sizing import (
    DraftModel,
    FitResult,
    ModelArchitecture,
    fits,
    gguf_block_type,
    lora_slot_bytes,
    mtp_draft,
)
from pagoda_runtime.contract.speculative import MTP

from pagoda_operator.models import InferenceServiceSpec, VariantSpec
from pagoda_operator.parallelism import split_error


@dataclass(frozen=True)
class Checkpoint:
    """What the download Job (or a pvc:// model's sizing Job) read from the checkpoint itself
    (config.json, GGUF metadata)."""

    architecture: ModelArchitecture
    stored_quantization: str | None = None  # awq, gptq, gguf, fp8, int8; None for float weights
    eagle_head: EagleHeadShape | None = None  # the folder holds an EAGLE head (its architecture's)


@dataclass(frozen=True)
class VariantPlan:
    variant: VariantSpec
    quantization: str  # what --quantization auto resolves to, as far as the spec tells
    fit: FitResult | None  # None: the spec lacks the architecture or the capacity to decide
    autoscales: bool  # an HPA owns the replica count between min and max
    # Why the model does not split over the tensor-parallel ranks: an explicit architecture or a
    # downloaded checkpoint (the apiserver already refuses named families that do not split).
    split_error: str | None = None
    # Why the variant's speculative method cannot draft for the model (mtp without an MTP layer).
    speculation_error: str | None = None

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def servable(self) -> bool:
        """Gets pods: all but a variant whose model is known not to split or not to fit, or not to
        hold what its speculative method drafts with."""
        fitting = self.fit is None or self.fit.fits
        return self.split_error is None and self.speculation_error is None and fitting


@dataclass(frozen=True)
class ServicePlan:
    spec: InferenceServiceSpec
    variants: tuple[VariantPlan, ...]
    # No pods yet: the checkpoint that sizes them is being read (a pvc:// model's sizing Job), and
    # a pod started now might not fit.
    held: bool = False

    @property
    def servable(self) -> tuple[VariantPlan, ...]:
        return () if self.held else tuple(v for v in self.variants if v.servable)


def capacity_bytes(spec: InferenceServiceSpec) -> int | None:
    """Memory each rank's slice of the model must fit in: one GPU's memory, or the pod's memory on
    the CPU."""
    quantity = spec.resources.gpu_memory if spec.resources.gpus else spec.resources.memory
    return None if quantity is None else int(parse_quantity(str(quantity)))


def sized_quantization(
    spec: InferenceServiceSpec, variant: VariantSpec, checkpoint: Checkpoint | None = None
) -> str:
    """The method the runtime will build the variant's projections with, as far as the spec and
    checkpoint tell: the rule is docs/architecture.md#quantization."""
    stored = "gguf" if spec.model.is_gguf else None
    if checkpoint is not None:
        stored = checkpoint.stored_quantization
    elif variant.quantization in ("awq", "gptq"):
        stored = variant.quantization
    device_type = "cuda" if spec.resources.gpus else "cpu"
    return select_quantization(
        variant.quantization, stored, device_type, spec.model.source, spec.runtime.dtype
    )


def _architecture(spec: InferenceServiceSpec, checkpoint: Checkpoint | None) -> ModelArchitecture | None:
    # The spec's family or architecture wins: it is what the user asked to be sized by.
    return spec.model.sizing_architecture() or (checkpoint.architecture if checkpoint else None)


def draft_source(variant: VariantSpec) -> str | None:
    """The source of the variant's draft model (or EAGLE head), if it speculates with one."""
    speculative = variant.speculative
    return speculative.model.source if speculative and speculative.model else None


def draft_noun(variant: VariantSpec) -> str:
    """What the variant's speculative.model is, in the status's words."""
    return "EAGLE head" if variant.speculative and variant.speculative.eagle_head else "draft model"


def _draft(
    spec: InferenceServiceSpec, variant: VariantSpec, checkpoint: Checkpoint | None
) -> DraftModel | None:
    """The variant's draft model as the fit check counts it, None where it has none or where neither
    the spec nor its checkpoint tells its shape. The runtime loads a draft with --quantization auto:
    a GGUF draft stays in its blocks, a float one in floats."""
    draft = variant.speculative.draft if variant.speculative else None
    if draft is None or variant.speculative.eagle_head:
        return None
    arch = draft.sizing_architecture() or (checkpoint.architecture if checkpoint else None)
    if arch is None:
        return None
    stored = checkpoint.stored_quantization if checkpoint else ("gguf" if draft.is_gguf else None)
    device_type = "cuda" if spec.resources.gpus else "cpu"
    quantization = select_quantization("auto", stored, device_type, draft.source, spec.runtime.dtype)
    return DraftModel(arch, quantization, gguf_block_type(draft.source) if quantization == "gguf" else None)


def drafts_with_mtp(variant: VariantSpec) -> bool:
    return variant.speculative is not None and variant.speculative.method == MTP


def _mtp(variant: VariantSpec, arch: ModelArchitecture | None, quantization: str) -> DraftModel | None:
    """The model's multi-token-prediction layer as the fit check counts it (sizing.mtp_draft), in
    the model's quantization, where the variant drafts with it; None where the model's shape is
    unknown or holds none (speculation_error)."""
    if not drafts_with_mtp(variant) or arch is None or not arch.num_nextn_predict_layers:
        return None
    return mtp_draft(arch, quantization)


def speculation_error(variant: VariantSpec, arch: ModelArchitecture | None) -> str | None:
    """Why the variant's speculative method cannot draft for the model, as far as its shape tells."""
    if not drafts_with_mtp(variant) or arch is None or arch.num_nextn_predict_layers:
        return None
    return (
        "speculative.method mtp drafts with the model's multi-token-prediction layer, and the model has "
        "none (num_nextn_predict_layers 0); use eagle3, draft_model or ngram"
    )


def _head(variant: VariantSpec, checkpoint: Checkpoint | None) -> EagleHeadShape | None:
    """The variant's EAGLE head as the fit check counts it, None where it has none or where neither
    its checkpoint nor the spec's architecture (a one-layer model: the whole draft vocabulary
    assumed) tells its shape. A checkpoint that is no head of the method sizes nothing: the runtime
    refuses it by name."""
    speculative = variant.speculative
    if speculative is None or not speculative.eagle_head:
        return None
    if checkpoint is not None and checkpoint.eagle_head is not None:
        head = checkpoint.eagle_head
        return head if head.method == speculative.method else None
    arch = speculative.model.sizing_architecture()
    return EagleHeadShape(speculative.method, arch, arch.vocab_size) if arch is not None else None


def _fit(
    spec: InferenceServiceSpec,
    variant: VariantSpec,
    quantization: str,
    arch: ModelArchitecture | None,
    draft_checkpoint: Checkpoint | None = None,
) -> FitResult | None:
    capacity = capacity_bytes(spec)
    draft = _draft(spec, variant, draft_checkpoint) or _mtp(variant, arch, quantization)
    head = _head(variant, draft_checkpoint)
    sized_draft = draft is not None or head is not None or draft_source(variant) is None
    if arch is None or capacity is None or not sized_draft:
        return None
    max_model_len = spec.model.max_model_len or arch.max_position_embeddings
    lora = 0
    if spec.lora_enabled:
        rt = spec.runtime
        lora = lora_slot_bytes(arch, rt.max_loras, spec.max_lora_rank, rt.dtype, spec.tensor_parallel_size)
    return fits(
        arch,
        quantization,
        max_model_len,
        capacity,
        kv_dtype=variant.kv_cache_dtype,
        gguf_block=gguf_block_type(spec.model.source),
        tensor_parallel_size=spec.tensor_parallel_size,
        draft=draft,
        head=head,
        lora_bytes=lora,
        max_num_seqs=spec.runtime.max_num_seqs,
    )


def plan_variant(
    spec: InferenceServiceSpec,
    variant: VariantSpec,
    checkpoint: Checkpoint | None = None,
    draft_checkpoint: Checkpoint | None = None,
) -> VariantPlan:
    quantization = sized_quantization(spec, variant, checkpoint)
    autoscales = spec.autoscaling.enabled and variant.replicas.max > variant.replicas.min
    arch = _architecture(spec, checkpoint)
    split = split_error(arch, spec.tensor_parallel_size, quantization) if arch is not None else None
    draft = _draft(spec, variant, draft_checkpoint) or _mtp(variant, arch, quantization)
    if split is None and draft is not None:
        # The runtime shards a draft over the target's ranks: it must split over them as well.
        draft_split = split_error(draft.architecture, spec.tensor_parallel_size, draft.quantization)
        split = draft_split and f"speculative.model (split over the same ranks as the model): {draft_split}"
    fit = None if split else _fit(spec, variant, quantization, arch, draft_checkpoint)
    return VariantPlan(variant, quantization, fit, autoscales, split, speculation_error(variant, arch))


def plan_service(
    spec: InferenceServiceSpec,
    checkpoint: Checkpoint | None = None,
    *,
    held: bool = False,
    draft_checkpoints: Mapping[str, Checkpoint] = MappingProxyType({}),
) -> ServicePlan:
    """checkpoint: read from the files once an hf:// or s3:// model is downloaded, or a pvc:// one
    read; held: while that read, or a draft model's, is under way (ServicePlan.held);
    draft_checkpoints: the same of the variants' draft models (or EAGLE heads), by variant name."""
    return ServicePlan(
        spec,
        tuple(plan_variant(spec, v, checkpoint, draft_checkpoints.get(v.name)) for v in spec.variants),
        held,
    )
