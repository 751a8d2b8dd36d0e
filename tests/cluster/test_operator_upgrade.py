"""An operator upgrade that changes every InferenceService's pods (here a new --runtime-image default)
rolls them one workload at a time, says so in the waiting ones' status, and leaves pinned images alone.

kwok's node runs the pods; a taint added before the upgrade keeps the first rolled variant's new pod
Pending, so that the test can see the others wait for it rather than race its rollout.
"""

from __future__ import annotations

import pytest
from kube_objects import apply, get, wait_for
from operator_process import OperatorProcess
from pagoda_operator.names import variant_object_name
from test_operator import inference_service, wait_ready
from test_operator_safety import wait_condition

pytestmark = pytest.mark.cluster

OLD, NEW, PINNED = "pagoda-runtime:0.1.0", "pagoda-runtime:0.2.0", "registry.example/pagoda-runtime:0.1.0"
HOLD_TAINT = "pagoda.dev/upgrade-test=hold:NoSchedule"
NODE = "gpu-node-0"


def _image(cp, namespace: str, name: str) -> str:
    deployment = get(cp, "deployment", variant_object_name(name, "bf16"), "-n", namespace)
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def _service(name: str, image: str | None = None) -> dict:
    isvc = inference_service(variants=[("bf16", "none")], max_replicas=1)
    isvc["metadata"]["name"] = name
    if image:
        isvc["spec"]["runtime"]["image"] = image
    return isvc


@pytest.fixture
def operator_at(operator_kubeconfig, isvc_namespace, tmp_path):
    """Starts the operator with a runtime image default, watching the test's namespace alone: the
    services earlier tests left in namespaces still being deleted are no part of its upgrade."""
    started: list[OperatorProcess] = []

    def start(image: str) -> OperatorProcess:
        for running in started:
            running.stop()
        operator = OperatorProcess(
            operator_kubeconfig,
            tmp_path,
            resync_seconds=2.0,
            namespaces=(isvc_namespace,),
            # Peering as deployed: through the KopfPeering the operator creates in the namespace,
            # which the stopped operator left.
            args=(f"--runtime-image={image}",),
        )
        operator.start()
        started.append(operator)
        return operator

    yield start
    for operator in started:
        operator.stop()
    failures = started[0].failures() if started else []
    assert not failures, "\n".join(failures[:10])


def test_an_operator_upgrade_rolls_services_one_at_a_time(control_plane, operator_at, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    operator = operator_at(OLD)
    for name in ("alpha", "beta"):
        apply(cp, ns, _service(name))
    apply(cp, ns, _service("pinned", PINNED))
    for name in ("alpha", "beta", "pinned"):
        wait_ready(cp, operator, ns, name)
    stored = get(cp, "infsvc", "alpha", "-n", ns)
    assert "image" not in stored["spec"]["runtime"], "the default must not be stored in the object"
    assert {_image(cp, ns, n) for n in ("alpha", "beta")} == {OLD}

    cp.kubectl("taint", "node", NODE, HOLD_TAINT)
    try:
        operator = operator_at(NEW)
        first = wait_for(
            lambda: [n for n in ("alpha", "beta") if _image(cp, ns, n) == NEW],
            timeout=60,
            what="one service to start rolling to the new default",
            details=operator.log_tail,
        )
        assert len(first) == 1, (first, operator.log_tail(200))
        (waiting,) = {"alpha", "beta"} - set(first)
        isvc = wait_condition(cp, operator, ns, waiting, "Progressing", "True", "UpgradeQueued")
        assert variant_object_name(first[0], "bf16") in condition_message(isvc)
        # Several resyncs later the other one still serves on its old pods.
        for _ in range(3):
            wait_for(lambda: operator.handled(ns, waiting, "Resync succeeded"), what="a resync")
        assert _image(cp, ns, waiting) == OLD
    finally:
        cp.kubectl("taint", "node", NODE, f"{HOLD_TAINT}-")

    wait_for(
        lambda: _image(cp, ns, waiting) == NEW,
        timeout=90,
        what=f"{waiting} to roll once {first[0]} is done",
        details=operator.log_tail,
    )
    for name in ("alpha", "beta", "pinned"):
        wait_ready(cp, operator, ns, name)
    assert _image(cp, ns, "pinned") == PINNED
    reasons = [e["reason"] for e in get(cp, "events", "-n", ns)["items"]]
    assert reasons.count("OperatorUpgrade") == 2, reasons


def condition_message(isvc: dict) -> str:
    return next(c["message"] for c in isvc["status"]["conditions"] if c["type"] == "Progressing")
