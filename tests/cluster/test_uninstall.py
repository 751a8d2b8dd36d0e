"""`kubectl delete -k manifests/` works while the operator is stopped: no finalizer holds an
InferenceService, so the CRD and every InferenceService go with the install. On a control plane of
its own, because the suite's shared one keeps its install for the other modules."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import ROOT, controlplane, started_control_plane, write_operator_kubeconfig
from kube_objects import apply, get_or_none
from operator_process import OperatorProcess
from test_operator import inference_service, wait_ready, wait_resyncs

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def own_control_plane() -> Iterator[controlplane.ControlPlane]:
    yield from started_control_plane()


def test_uninstalling_works_while_the_operator_is_stopped(own_control_plane, tmp_path):
    cp = own_control_plane
    manifests = str(ROOT / "manifests")
    cp.kubectl("apply", "-k", manifests)
    cp.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/inferenceservices.pagoda.dev")
    cp.kubectl("create", "namespace", "served")
    operator = OperatorProcess(
        write_operator_kubeconfig(cp, tmp_path / "kubeconfig"), tmp_path, resync_seconds=1.0
    )
    operator.start()
    try:
        apply(cp, "served", inference_service(variants=[("bf16", "none")], max_replicas=1))
        wait_ready(cp, operator, "served", "chat")
        wait_resyncs(operator, "served", "chat", 1)
    finally:
        operator.stop()
    assert not operator.failures(), operator.failures()

    # What the claim is about: our CRD (with every InferenceService) and the install namespace go,
    # which a finalizer of ours would hold forever. kubectl's own wait reads every object, and
    # twice on a loaded machine the apiserver left kopf's peering CRD (which holds nothing) Terminating
    # for minutes, its instance cleanup failing with "could not list instances: storage is
    # (re)initializing"; so kubectl only asks, and the wait reads our two objects.
    cp.kubectl("delete", "-k", manifests, "--wait=false")
    deadline = time.monotonic() + 300
    while get_or_none(cp, "crd", "inferenceservices.pagoda.dev") or get_or_none(
        cp, "namespace", "pagoda-system"
    ):
        assert time.monotonic() < deadline, _leftovers(cp)
        time.sleep(2)


def _leftovers(cp: controlplane.ControlPlane) -> str:
    """Each install CRD and the namespace still there, with finalizers and conditions (a CRD's
    Terminating condition says what the apiserver's cleanup of its instances waits for)."""
    lines = []
    for kind, name in [
        ("crd", "inferenceservices.pagoda.dev"),
        ("crd", "kopfpeerings.kopf.dev"),
        ("crd", "clusterkopfpeerings.kopf.dev"),
        ("namespace", "pagoda-system"),
    ]:
        obj = get_or_none(cp, kind, name)
        if obj is not None:
            conditions = obj.get("status", {}).get("conditions", [])
            lines.append(f"{kind} {name}: finalizers {obj['metadata'].get('finalizers')}, {conditions}")
    return "\n".join(lines) or "nothing of the install left"
