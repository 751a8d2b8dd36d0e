"""InferenceService specs for the operator tests, built from the smallest valid one."""

from __future__ import annotations

import copy

from pagoda_operator.models import InferenceServiceSpec, InferenceServiceStatus
from pagoda_operator.plan import ServicePlan
from pagoda_operator.status import compute_status

NS, NAME, UID = "ml", "llama", "0b7e1d2a-0000-4000-8000-000000000001"
MINIMAL = {"model": {"source": "pvc://models/llama-3-8b"}, "variants": [{"name": "bf16"}]}


def spec(**changes) -> InferenceServiceSpec:
    """MINIMAL with top-level sections replaced, e.g. spec(resources={"gpus": 0})."""
    raw = copy.deepcopy(MINIMAL)
    raw.update(changes)
    return InferenceServiceSpec.model_validate(raw)


def first_status(plan: ServicePlan, **kwargs) -> InferenceServiceStatus:
    """The status of service NAME planned as given, before it has any workload."""
    return compute_status(
        plan,
        namespace=NS,
        name=NAME,
        generation=1,
        deployments=[],
        pods=[],
        previous=None,
        now="2026-01-01T00:00:00Z",
        **kwargs,
    )
