"""InferenceService specs for the operator tests, built from the smallest valid one."""

from __future__ import annotations

import copy

from pagoda_operator.models import InferenceServiceSpec

MINIMAL = {"model": {"source": "pvc://models/llama-3-8b"}, "variants": [{"name": "bf16"}]}


def spec(**changes) -> InferenceServiceSpec:
    """MINIMAL with top-level sections replaced, e.g. spec(resources={"gpus": 0})."""
    raw = copy.deepcopy(MINIMAL)
    raw.update(changes)
    return InferenceServiceSpec.model_validate(raw)
