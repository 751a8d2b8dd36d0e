"""The end-to-end cluster (tests/e2e/providers.py): started once per session, Pagoda installed on it
from its image with `kubectl apply -k manifests/`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from providers import ROOT, Cluster, selected

OPERATOR_NAMESPACE = "pagoda-system"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    provider = selected()
    reason = provider.unavailable_reason()
    if reason:
        pytest.skip(f"{provider.name} cluster: {reason}")
    instance = provider()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def installed(cluster, tmp_path_factory) -> str:
    """`kubectl apply -k` of manifests/ with the images this run built (a kustomize overlay that sets
    only the two images, as README tells users to); returns the operator's image reference."""
    overlay = tmp_path_factory.mktemp("overlay")
    name, _, tag = cluster.operator_image.rpartition(":")
    runtime_name, _, runtime_tag = cluster.runtime_image.rpartition(":")
    (overlay / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes no absolute path
                "resources": [os.path.relpath(ROOT / "manifests", overlay)],
                "images": [
                    {"name": "pagoda-operator", "newName": name, "newTag": tag},
                    {"name": "pagoda-runtime", "newName": runtime_name, "newTag": runtime_tag},
                ],
            }
        )
    )
    cluster.kubectl("apply", "-k", str(overlay))
    cluster.kubectl(
        "-n",
        OPERATOR_NAMESPACE,
        "rollout",
        "status",
        "deployment/pagoda-operator",
        "--timeout=300s",
        timeout=330,
    )
    return cluster.operator_image
