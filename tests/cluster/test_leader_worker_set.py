"""Replicas that span nodes: the real LeaderWorkerSet controller (v0.9.0, built from the Go module
proxy) joins the loopback control plane with its admission webhooks, and the operator's
LeaderWorkerSet becomes leader and worker pods on kwok's fake GPU nodes.

Not exercised here: LWS's own certificate rotation and in-cluster webhook Service (the webhooks are
registered by URL on 127.0.0.1, see ControlPlane.start_lws_controller), and real ranks joining (kwok
runs no containers; tests/runtime covers the runtime's side of the LWS environment, and the
end-to-end node has no cluster DNS to resolve LWS_LEADER_ADDRESS, a pod's name under the group's
headless Service).
"""

from __future__ import annotations

import pytest
from kube_objects import apply, condition, get, get_or_none, pods, wait_for
from pagoda_operator.leader_worker_set import LABEL_WORKER_INDEX
from pagoda_operator.names import group_set_name, variant_object_name

pytestmark = pytest.mark.cluster

# Two more 8-GPU kwok nodes: a 4-GPU Deployment pod and a group of two 4-GPU pods side by side.
NODES = ("gpu-node-lws-a", "gpu-node-lws-b")


@pytest.fixture(scope="module")
def lws(control_plane, lws_controller):
    for node in NODES:
        control_plane.create_gpu_node(node)
    yield
    for node in NODES:
        control_plane.kubectl("delete", "node", node, "--wait=false", check=False)


def llama_70b(nodes: int) -> dict:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "big"},
        "spec": {
            "model": {"source": "file:///models/llama-3-70b", "family": "llama-3-70b", "maxModelLen": 8192},
            "variants": [{"name": "bf16", "replicas": {"min": 1, "max": 2}}],
            "resources": {"gpus": 4, "gpuMemory": "80Gi", "cpu": "8", "memory": "64Gi"},
            "parallelism": {"nodes": nodes},
            "drain": {"timeoutSeconds": 5, "endpointRemovalSeconds": 1},
        },
    }


def flag(container: dict, name: str) -> str:
    return container["args"][container["args"].index(name) + 1]


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_one_node_is_a_deployment_and_two_nodes_a_leader_worker_set_group(
    control_plane, lws, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, llama_70b(nodes=1))
    deployment_name = variant_object_name("big", "bf16")
    deployment = wait_for(
        lambda: get_or_none(cp, "deployment", deployment_name, "-n", ns),
        check=lambda d: d and d.get("status", {}).get("readyReplicas") == 1,
        timeout=60,
        what="the 4-GPU Deployment to be ready",
        details=pagoda_operator.log_tail,
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert flag(container, "--tensor-parallel-size") == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"

    # The same variant across two nodes: a LeaderWorkerSet replaces the Deployment, make before break.
    apply(cp, ns, llama_70b(nodes=2))
    group = group_set_name("big", "bf16")
    group_pods = wait_for(
        lambda: pods(cp, ns, f"leaderworkerset.sigs.k8s.io/name={group}"),
        check=lambda found: len(found) == 2,
        timeout=60,
        what="the leader and the worker pod",
        details=lambda: pagoda_operator.log_tail() + cp.log_tail("lws-controller"),
    )
    by_index = {p["metadata"]["labels"][LABEL_WORKER_INDEX]: p for p in group_pods}
    assert set(by_index) == {"0", "1"}
    for index, pod in by_index.items():
        (container,) = pod["spec"]["containers"]
        assert flag(container, "--tensor-parallel-size") == "8"
        assert flag(container, "--distributed-port") == "29500"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        injected = env(container)
        assert injected["LWS_GROUP_SIZE"] == "2" and injected["LWS_WORKER_INDEX"] == index
        assert injected["LWS_LEADER_ADDRESS"] == f"{group}-0.{group}.{ns}"
        assert pod["metadata"]["labels"]["pagoda.dev/variant"] == "bf16"
    leader, worker = by_index["0"]["spec"]["containers"][0], by_index["1"]["spec"]["containers"][0]
    assert "readinessProbe" in leader and "readinessProbe" not in worker
    assert {p["name"] for p in leader["ports"]} == {"http", "distributed"} and "ports" not in worker
    assert (
        get(cp, "service", variant_object_name("big", "bf16"), "-n", ns)["spec"]["selector"][
            LABEL_WORKER_INDEX
        ]
        == "0"
    )

    isvc = wait_for(
        lambda: get(cp, "infsvc", "big", "-n", ns),
        check=lambda i: (
            condition(i, "Ready").get("status") == "True"
            and get_or_none(cp, "deployment", deployment_name, "-n", ns) is None
        ),
        timeout=60,
        what="a ready group and the old Deployment retired",
        details=pagoda_operator.log_tail,
    )
    assert isvc["status"]["variants"] == [
        {
            "name": "bf16",
            "replicas": 1,
            "readyReplicas": 1,
            "fits": True,
            "service": variant_object_name("big", "bf16"),
            "modelNames": ["big", "big:bf16"],
        }
    ]

    # The top-level Service selects workers too, but they declare no http port: only the leader is
    # an endpoint clients reach.
    leader_ip = get(cp, "pod", by_index["0"]["metadata"]["name"], "-n", ns)["status"]["podIP"]

    def served_addresses() -> set[str]:
        slices = get(cp, "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=big")["items"]
        return {
            a for sl in slices if sl.get("ports") for ep in sl.get("endpoints") or [] for a in ep["addresses"]
        }

    wait_for(
        served_addresses, check=lambda found: found == {leader_ip}, what="the leader as the only endpoint"
    )

    # What LWS's defaulting webhook adds to the operator's apply is no change: resyncs write nothing.
    version = get(cp, "leaderworkerset", group, "-n", ns)["metadata"]["resourceVersion"]
    resyncs = pagoda_operator.handled(ns, "big", "Resync succeeded")
    wait_for(
        lambda: pagoda_operator.handled(ns, "big", "Resync succeeded"),
        check=lambda count: count >= resyncs + 2,
        what="two resyncs",
    )
    assert get(cp, "leaderworkerset", group, "-n", ns)["metadata"]["resourceVersion"] == version

    # The HPA reads the group count through the LeaderWorkerSet's scale subresource (no metrics
    # adapter runs here, so it cannot compute a recommendation: that is the autoscaling suite's).
    hpa = wait_for(
        lambda: get(cp, "hpa", variant_object_name("big", "bf16"), "-n", ns),
        check=lambda h: (
            h["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
            and condition(h, "AbleToScale").get("reason") == "SucceededGetScale"
        ),
        timeout=45,
        what="the HPA to read the LeaderWorkerSet's scale",
    )
    assert hpa["status"]["currentReplicas"] == 1
