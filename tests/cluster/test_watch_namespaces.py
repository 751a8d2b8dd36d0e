"""An operator started with --namespace (the chart's operator.watchNamespaces) peers through kopf's
namespaced KopfPeering, which it creates in every namespace it watches, also in one that matches a
glob only after the operator started; it serves those namespaces and leaves the others alone. It
runs with the RBAC and CRDs of manifests/, without --standalone, as its Deployment runs it."""

from __future__ import annotations

import uuid

import pytest
from kube_objects import apply, children, get, get_or_none, wait_for
from operator_process import OperatorProcess
from test_operator import inference_service, wait_ready, wait_resyncs

pytestmark = pytest.mark.cluster

PEERING = "pagoda-operator"  # the operator's --peering-name default


def _create_namespace(cp, namespace: str) -> None:
    cp.kubectl("create", "namespace", namespace)
    cp.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")


def _peers(cp, namespace: str) -> dict:
    """The operators keeping themselves alive in the namespace's KopfPeering; None while it is missing."""
    peering = get_or_none(cp, "kopfpeerings.kopf.dev", PEERING, "-n", namespace)
    return None if peering is None else peering.get("status") or {}


def _service() -> dict:
    return inference_service(variants=[("bf16", "none")], max_replicas=1)


@pytest.fixture
def team_namespaces(control_plane):
    """A prefix for the test's own namespaces, all deleted afterwards."""
    prefix = f"team-{uuid.uuid4().hex[:6]}"
    yield prefix
    for suffix in ("a", "b"):
        control_plane.kubectl(
            "delete", "namespace", f"{prefix}-{suffix}", "--wait=false", "--ignore-not-found", check=False
        )


def test_an_operator_watching_namespaces_peers_there_and_serves_them_alone(
    control_plane, operator_kubeconfig, isvc_namespace, team_namespaces, tmp_path
):
    cp, unwatched = control_plane, isvc_namespace
    named, later = f"{team_namespaces}-a", f"{team_namespaces}-b"
    _create_namespace(cp, named)
    operator = OperatorProcess(
        operator_kubeconfig, tmp_path, resync_seconds=2.0, namespaces=(named, f"{team_namespaces}-b*")
    )
    operator.start()
    try:
        wait_for(lambda: _peers(cp, named), what=f"the keep-alive in {named}", details=operator.log_tail)
        # A namespace that matches the glob only now: without its KopfPeering kopf would pause the
        # whole operator, the namespaces it already served included.
        _create_namespace(cp, later)
        for namespace in (named, later, unwatched):
            apply(cp, namespace, _service())
        for namespace in (named, later):
            wait_ready(cp, operator, namespace, "chat")
        assert _peers(cp, later) is not None
        wait_resyncs(operator, named, "chat", 2)

        left_alone = get(cp, "infsvc", "chat", "-n", unwatched)
        assert "status" not in left_alone, left_alone["status"]
        assert not any(key.startswith("pagoda.dev/") for key in left_alone["metadata"].get("annotations", {}))
        assert children(cp, unwatched, "chat") == {}
        assert _peers(cp, unwatched) is None
    finally:
        operator.stop()
    failures = operator.failures()
    assert not failures, "\n".join(failures[:10])
