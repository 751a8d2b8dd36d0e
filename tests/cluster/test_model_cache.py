"""The shared model cache on the loopback control plane: the operator creates one claim and one
download Job per model revision, replicas wait for it, status follows the Job, and deleting the
InferenceService leaves the data. kwok runs the Job's pod to completion (it runs no container), so
the download itself is tested against real servers in tests/model_cache."""

from __future__ import annotations

import pytest
from kube_objects import apply, condition, get, get_or_none, wait_for

pytestmark = pytest.mark.cluster

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def s3_service(name: str) -> dict:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "source": "s3://models/llama-3.2-1b",
                "s3": {"endpoint": "http://minio.storage.svc:9000", "credentialsSecretName": "s3"},
                "cache": {"size": "1Gi"},
                "family": "llama-3.2-1b",
                "maxModelLen": 4096,
            },
            "variants": [{"name": "bf16", "quantization": "none"}],
            "resources": {"gpus": 1, "gpuProduct": GPU_PRODUCT, "gpuMemory": "80Gi"},
            "drain": {"timeoutSeconds": 5, "endpointRemovalSeconds": 1},
        },
    }


def test_cache_is_shared_followed_and_kept(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, s3_service("a"))
    apply(cp, ns, s3_service("b"))
    isvc = wait_for(
        lambda: get(cp, "infsvc", "a", "-n", ns),
        check=lambda i: (i.get("status") or {}).get("modelCache", {}).get("phase") == "Pending",
        what="the cache to wait for its claim",
        details=pagoda_operator.log_tail,
    )
    claim = isvc["status"]["modelCache"]["claimName"]
    # One claim and one Job for both services, owned by neither.
    jobs = get(cp, "jobs", "-n", ns)["items"]
    assert [j["metadata"]["name"] for j in jobs] == [claim]
    assert "ownerReferences" not in jobs[0]["metadata"]
    assert condition(isvc, "Ready")["reason"] == "ModelCachePending"
    assert "not bound" in isvc["status"]["modelCache"]["message"]

    # A volume for the claim: the Job's pod is scheduled, kwok completes it, the cache is Ready.
    cp.kubectl("apply", "-f", "-", input=_volume(ns, claim))
    try:
        for name in ("a", "b"):
            ready = wait_for(
                lambda name=name: get(cp, "infsvc", name, "-n", ns),
                check=lambda i: condition(i, "Ready").get("status") == "True",
                timeout=90,
                what=f"{name} Ready once the cache is",
                details=pagoda_operator.log_tail,
            )
            assert ready["status"]["modelCache"]["summary"] == "Ready"
        cp.kubectl("delete", "infsvc", "a", "b", "-n", ns)
        wait_for(
            lambda: get_or_none(cp, "deployment", "a-bf16", "-n", ns),
            check=lambda d: d is None,
            what="the deployment to go",
        )
        assert get_or_none(cp, "pvc", claim, "-n", ns) is not None  # the data stays
        assert get_or_none(cp, "job", claim, "-n", ns) is not None
    finally:
        cp.kubectl("delete", "pv", f"{ns}-model", "--wait=false", "--ignore-not-found", check=False)


def _volume(namespace: str, claim: str) -> str:
    return f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {namespace}-model}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  claimRef: {{namespace: {namespace}, name: {claim}}}
  hostPath: {{path: /tmp/{namespace}-model}}
"""
