"""The loopback control plane really schedules, runs (via kwok) and garbage-collects."""

from __future__ import annotations

import json
import time
import uuid

import pytest

pytestmark = pytest.mark.cluster


def _wait(predicate, timeout: float = 60.0, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def _get(cp, *args: str) -> dict:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def _deployment(name: str, gpus: int = 1, replicas: int = 1) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.invalid/pagoda-runtime:test",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


@pytest.fixture
def namespace(control_plane):
    ns = f"t-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", ns)
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_apiserver_ready(control_plane):
    out = control_plane.kubectl("get", "--raw", "/readyz").stdout
    assert out.strip() == "ok"
    assert control_plane.server.startswith("https://127.0.0.1:")


def test_fake_gpu_node_ready(control_plane):
    node = _get(control_plane, "node", control_plane.node_name)
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["capacity"]["cpu"] == "64"
    assert node["status"]["capacity"]["memory"] == "512Gi"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"


def test_gpu_deployment_scheduled_and_ready(control_plane, namespace):
    cp = control_plane
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_deployment("gpu-app")))

    def ready_pods():
        pods = _get(cp, "pods", "-n", namespace, "-l", "app=gpu-app")["items"]
        return [
            p
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]

    pods = _wait(ready_pods, what="a Ready gpu-app pod")
    pod = pods[0]
    assert pod["spec"]["nodeName"] == cp.node_name
    assert pod["status"]["phase"] == "Running"
    assert pod["status"].get("podIP")
    cp.kubectl("rollout", "status", "-n", namespace, "deployment/gpu-app", "--timeout=60s")


def test_gpu_requests_beyond_capacity_stay_pending(control_plane, namespace):
    cp = control_plane
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_deployment("too-big", gpus=9)))

    def unschedulable():
        pods = _get(cp, "pods", "-n", namespace, "-l", "app=too-big")["items"]
        return [
            p
            for p in pods
            if any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]

    pod = _wait(unschedulable, what="the 9-GPU pod to be Unschedulable")[0]
    assert not pod["spec"].get("nodeName")


def test_namespace_deletion_garbage_collects(control_plane):
    cp = control_plane
    ns = f"gc-{uuid.uuid4().hex[:8]}"
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(_deployment("doomed")))
    cp.kubectl("create", "configmap", "cfg", "-n", ns, "--from-literal=a=b")
    _wait(lambda: _get(cp, "pods", "-n", ns)["items"], what="a pod in the namespace")

    cp.kubectl("delete", "namespace", ns, "--wait=false")

    def gone():
        return cp.kubectl("get", "namespace", ns, check=False).returncode != 0

    _wait(gone, timeout=90, what=f"namespace {ns} to be deleted")
    left = _get(
        cp, "pods,replicasets,deployments,configmaps", "-A", f"--field-selector=metadata.namespace={ns}"
    )["items"]
    assert left == []


ADAPTER_RULES = """\
rules:
- seriesQuery: 'pagoda_num_requests_waiting{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: "^(.*)$", as: "${1}"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


def test_aggregation_layer_serves_custom_metrics_api(control_plane):
    """The front-proxy/requestheader setup lets an APIService (prometheus-adapter) be proxied."""
    cp = control_plane
    # No Prometheus needed for discovery: the adapter only logs failed relists.
    cp.start_prometheus_adapter("http://127.0.0.1:9", ADAPTER_RULES)
    out = json.loads(cp.kubectl("get", "--raw", "/apis/custom.metrics.k8s.io/v1beta1").stdout)
    assert out["groupVersion"] == "custom.metrics.k8s.io/v1beta1"
    svc = _get(cp, "apiservice", "v1beta1.custom.metrics.k8s.io")
    available = [c for c in svc["status"]["conditions"] if c["type"] == "Available"]
    assert available and available[0]["status"] == "True"
