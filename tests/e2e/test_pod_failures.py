"""What a user sees when their pods cannot run, on a cluster that runs real pods: an image that
cannot be pulled and a runtime that crashes at start each turn the InferenceService Degraded with
the kubelet's reason, and post a Warning event on the InferenceService itself (what
`kubectl describe infsvc` shows). The fake nodes of the cluster suite never reach these states."""

from __future__ import annotations

import json

import pytest
import yaml
from polling import wait_for
from providers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = ROOT / "manifests" / "examples" / "cpu-smollm2.yaml"
NAMESPACE = "pagoda-e2e-failures"


def _condition(cluster, name: str, type_: str) -> dict:
    found = cluster.kubectl("get", "infsvc", name, "-n", NAMESPACE, "-o", "json").stdout
    conditions = json.loads(found).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def _warnings(cluster, name: str) -> list[str]:
    events = cluster.kubectl(
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"involvedObject.kind=InferenceService,involvedObject.name={name},type=Warning",
        "-o",
        "json",
    ).stdout
    return [e["reason"] for e in json.loads(events)["items"]]


def _wait_degraded(cluster, name: str, reasons: set[str], timeout: float = 300) -> dict:
    return wait_for(
        lambda: _condition(cluster, name, "Degraded"),
        check=lambda c: c.get("status") == "True" and c.get("reason") in reasons,
        timeout=timeout,
        what=f"{name} to be Degraded with one of {sorted(reasons)}",
        interval=2,
    )


@pytest.fixture(scope="module")
def broken(cluster, installed):
    """Two InferenceServices that cannot serve: one names an image nobody can pull, the other
    passes the runtime a flag it refuses, so its container exits at once and again."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    base = yaml.safe_load(EXAMPLE.read_text())
    base["spec"]["resources"]["cpu"] = "100m"
    # Fixed replicas: no HPA, whose missing metrics would be a second, unrelated Degraded reason.
    base["spec"]["variants"][0]["replicas"] = {"min": 1, "max": 1}
    unpullable = json.loads(json.dumps(base))
    unpullable["metadata"]["name"] = "unpullable"
    unpullable["spec"]["runtime"]["image"] = "localhost/pagoda-runtime:missing"
    unpullable["spec"]["runtime"]["imagePullPolicy"] = "IfNotPresent"
    crashing = json.loads(json.dumps(base))
    crashing["metadata"]["name"] = "crashing"
    crashing["spec"]["runtime"]["image"] = cluster.runtime_image
    crashing["spec"]["runtime"]["extraArgs"] = ["--no-such-flag"]
    for isvc in (unpullable, crashing):
        cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(isvc))
    yield
    cluster.kubectl("delete", "namespace", NAMESPACE, "--timeout=300s", timeout=330)


def test_an_image_that_cannot_be_pulled_is_degraded_with_an_event(cluster, broken):
    degraded = _wait_degraded(cluster, "unpullable", {"ErrImagePull", "ImagePullBackOff"})
    assert "unpullable" in degraded["message"], degraded
    assert _condition(cluster, "unpullable", "Ready")["status"] == "False"
    assert {"ErrImagePull", "ImagePullBackOff"} & set(_warnings(cluster, "unpullable"))


def test_a_runtime_that_crashes_at_start_is_degraded_with_an_event(cluster, broken):
    degraded = _wait_degraded(cluster, "crashing", {"CrashLoopBackOff"})
    assert "crashing" in degraded["message"], degraded
    assert _condition(cluster, "crashing", "Ready")["status"] == "False"
    assert "CrashLoopBackOff" in _warnings(cluster, "crashing")
