"""One InferenceService object as the operator reads it: its identity, its spec parsed at the edge,
and its plan once the model cache's state is known."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import ValidationError

from pagoda_operator.kube import Kube
from pagoda_operator.model_cache import CacheStatus
from pagoda_operator.models import GROUP, PLURAL, VERSION, InferenceServiceSpec
from pagoda_operator.names import NAME_RULES
from pagoda_operator.plan import ServicePlan, plan_service
from pagoda_operator.rules import enforce


def ids(body) -> tuple[str, str, str, int]:
    meta = body["metadata"]
    return meta["namespace"], meta["name"], meta["uid"], meta.get("generation", 1)


def parse(body) -> InferenceServiceSpec:
    enforce(body["metadata"]["name"], NAME_RULES)
    return InferenceServiceSpec.model_validate(dict(body.get("spec") or {}))


def namespace_services(k: Kube, namespace: str) -> list[tuple[str, InferenceServiceSpec]]:
    """Every InferenceService of the namespace whose spec is valid, by name: what shares the
    namespace's caches (an invalid one is reported by its own reconcile)."""
    services = []
    for item in k.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}").get("items", []):
        try:
            services.append((item["metadata"]["name"], parse(item)))
        except (ValidationError, ValueError):
            continue
    return services


def error_text(exc: ValidationError | ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
    return str(exc)


def plan_with_cache(
    spec: InferenceServiceSpec,
    cache: CacheStatus | None,
    drafts: Mapping[str, CacheStatus] = MappingProxyType({}),
) -> ServicePlan:
    """drafts: the caches (or sizing Jobs) of the variants' draft models, by variant name."""
    return plan_service(
        spec,
        cache.checkpoint if cache is not None else None,
        held=any(c.holds_replicas for c in (cache, *drafts.values()) if c is not None),
        draft_checkpoints={name: c.checkpoint for name, c in drafts.items() if c.checkpoint is not None},
    )
