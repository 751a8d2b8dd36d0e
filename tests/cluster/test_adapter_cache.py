"""spec.adapters on the loopback control plane, through the real operator and its RBAC: the adapter
cache's claim and one copy Job per adapter (kept when the service goes, as the model cache is), the
status per variant, and an adapter added to a serving service without touching its pods. kwok runs
no container, so no adapter is ever copied or loaded here: the copy is tested in
tests/runtime/test_lora_cache.py, the loading in tests/operator/test_adapters*.py."""

from __future__ import annotations

import copy

import pytest
from kube_objects import ISVC_LABEL, apply, get, get_or_none, pods, wait_for
from pagoda_operator.adapter_cache import adapter_ref
from pagoda_operator.models import AdapterSpec
from pagoda_operator.names import variant_object_name

pytestmark = pytest.mark.cluster

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
SQL = {"name": "sql", "source": "pvc://fine-tunes/sql", "rank": 16}
TONE = {"name": "tone", "source": "pvc://fine-tunes/tone", "rank": 8}
SERVICE = {
    "apiVersion": "pagoda.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat"},
    "spec": {
        "model": {"source": "bundled://smollm2-135m", "family": "smollm2-135m", "maxModelLen": 2048},
        "runtime": {"enableLora": True},
        "adapters": [SQL],
        "variants": [{"name": "bf16", "quantization": "none"}],
        "resources": {"gpus": 1, "gpuProduct": GPU_PRODUCT, "gpuMemory": "80Gi"},
        "drain": {"timeoutSeconds": 5, "endpointRemovalSeconds": 1},
    },
}


def _adapters(isvc: dict) -> list[tuple[str, str]]:
    variants = (isvc.get("status") or {}).get("variants") or [{}]
    return [(a["name"], a["state"]) for a in variants[0].get("adapters") or []]


def test_adapters_are_copied_by_jobs_and_added_without_a_restart(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, SERVICE)
    wait_for(
        lambda: get(cp, "infsvc", "chat", "-n", ns),
        check=lambda i: _adapters(i) == [("sql", "Downloading")],
        what="the adapter's copy to be under way",
        details=pagoda_operator.log_tail,
    )
    claim = get(cp, "pvc", "pagoda-adapters", "-n", ns)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and "ownerReferences" not in claim["metadata"]
    sql_job = adapter_ref(AdapterSpec.model_validate(SQL)).name
    job = get(cp, "job", sql_job, "-n", ns)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:3] == [
        "pagoda-runtime",
        "fetch",
        "/source/sql",
    ]
    deployment = variant_object_name("chat", "bf16")
    wait_for(
        lambda: pods(cp, ns, f"{ISVC_LABEL}=chat"),
        check=lambda found: len(found) == 1,
        what="the pod",
        details=pagoda_operator.log_tail,
    )
    before = get(cp, "deployment", deployment, "-n", ns)
    pod_names = [p["metadata"]["name"] for p in pods(cp, ns, f"{ISVC_LABEL}=chat")]

    more = copy.deepcopy(SERVICE)
    more["spec"]["adapters"] = [SQL, TONE]
    apply(cp, ns, more)
    wait_for(
        lambda: get(cp, "infsvc", "chat", "-n", ns),
        check=lambda i: _adapters(i) == [("sql", "Downloading"), ("tone", "Downloading")],
        what="the second adapter in the status",
        details=pagoda_operator.log_tail,
    )
    assert get_or_none(cp, "job", adapter_ref(AdapterSpec.model_validate(TONE)).name, "-n", ns) is not None
    after = get(cp, "deployment", deployment, "-n", ns)
    # The same pod template, hence the same ReplicaSet revision and the same pods.
    assert after["spec"]["template"] == before["spec"]["template"]
    revision = "deployment.kubernetes.io/revision"
    assert after["metadata"]["annotations"][revision] == before["metadata"]["annotations"][revision] == "1"
    assert [p["metadata"]["name"] for p in pods(cp, ns, f"{ISVC_LABEL}=chat")] == pod_names
