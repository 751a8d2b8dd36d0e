"""`kubectl delete -k manifests/` works while the operator is stopped: no finalizer holds an
InferenceService, so the CRD and every InferenceService go with the install. On a control plane of
its own, because the suite's shared one keeps its install for the other modules."""

from __future__ import annotations

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

    # A finalizer would hold the install forever; the apiserver's own cleanup of a CRD's instances
    # (each CRD in turn, retried with a growing back-off) once took over a minute on a loaded
    # machine, so the bound is three.
    deleted = cp.kubectl("delete", "-k", manifests, "--timeout=180s", timeout=210, check=False)
    assert deleted.returncode == 0, f"{deleted.stderr}{deleted.stdout}\n{_leftover_crds(cp)}"

    assert get_or_none(cp, "crd", "inferenceservices.pagoda.dev") is None
    assert get_or_none(cp, "namespace", "pagoda-system") is None


def _leftover_crds(cp: controlplane.ControlPlane) -> str:
    """Each install CRD still there, with its finalizers and Terminating condition (which says
    what the apiserver's cleanup of its instances is waiting for)."""
    lines = []
    for crd in ("inferenceservices.pagoda.dev", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        obj = get_or_none(cp, "crd", crd)
        if obj is None:
            continue
        terminating = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Terminating"]
        lines.append(f"{crd}: finalizers {obj['metadata'].get('finalizers')}, {terminating}")
    return "\n".join(lines) or "no install CRD left"
