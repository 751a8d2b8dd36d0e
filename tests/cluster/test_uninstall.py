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

    cp.kubectl("delete", "-k", manifests, "--timeout=60s", timeout=120)

    assert get_or_none(cp, "crd", "inferenceservices.pagoda.dev") is None
    assert get_or_none(cp, "namespace", "pagoda-system") is None
