"""The KopfPeering the operator creates in a watched namespace: a failure is said once in words a
user can act on and reported for a retry; a namespace being deleted needs none."""

from __future__ import annotations

import json
import logging

from kubernetes import client
from pagoda_operator.kube import Kube
from pagoda_operator.peering import ensure_namespaced


class RefusingKube(Kube):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(api_client=client.ApiClient())
        self.error = client.ApiException(
            status=status, reason=reason, body=json.dumps({"reason": reason, "message": message})
        )

    def ensure_peering(self, name: str, namespace: str | None = None) -> None:
        raise self.error


def test_a_namespace_being_deleted_needs_no_peering(caplog):
    k = RefusingKube(
        403, "NamespaceTerminating", 'kopfpeerings "pagoda-operator" is forbidden: NamespaceTerminating'
    )
    assert ensure_namespaced(k, "pagoda-operator", "team-a")
    assert not caplog.records


def test_a_missing_crd_is_reported_with_what_to_install(caplog):
    k = RefusingKube(404, "NotFound", "the server could not find the requested resource")
    with caplog.at_level(logging.ERROR):
        assert not ensure_namespaced(k, "pagoda-operator", "team-a")
    (record,) = caplog.records
    assert "KopfPeering 'pagoda-operator' in namespace 'team-a'" in record.message
    assert "the server could not find the requested resource" in record.message
    assert "manifests/kopf-peering-crd.yaml" in record.message
