"""Validation of rendered objects against the Kubernetes API types of the pinned client.

The kubernetes package's models are generated from the apiserver's OpenAPI schema and forbid
unknown fields with strict types, so parsing a manifest through them fails on a misspelled field
or a wrong type; serializing it back and comparing catches anything dropped on the way.
"""

from __future__ import annotations

from kubernetes import client

MODELS = {
    ("apps/v1", "Deployment"): client.V1Deployment,
    ("v1", "Service"): client.V1Service,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): client.V2HorizontalPodAutoscaler,
    ("policy/v1", "PodDisruptionBudget"): client.V1PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): client.V1NetworkPolicy,
    ("v1", "Namespace"): client.V1Namespace,
    ("v1", "ServiceAccount"): client.V1ServiceAccount,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): client.V1ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): client.V1ClusterRoleBinding,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): client.V1CustomResourceDefinition,
    ("v1", "ConfigMap"): client.V1ConfigMap,
    ("v1", "PersistentVolumeClaim"): client.V1PersistentVolumeClaim,
    ("batch/v1", "Job"): client.V1Job,
}


def _differences(expected, actual, path: str = "") -> list[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        return [
            d
            for key in sorted(set(expected) | set(actual))
            for d in _differences(expected.get(key), actual.get(key), f"{path}.{key}")
        ]
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        return [
            d
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for d in _differences(e, a, f"{path}[{i}]")
        ]
    return [] if expected == actual else [f"{path}: {expected!r} became {actual!r}"]


def validate(manifest: dict) -> None:
    """Raises ValueError naming the fields the schema does not accept as written."""
    model = MODELS[(manifest["apiVersion"], manifest["kind"])]
    parsed = model.from_dict(manifest)
    differences = _differences(manifest, client.ApiClient().sanitize_for_serialization(parsed))
    if differences:
        raise ValueError(f"{manifest['kind']} does not match {model.__name__}: {'; '.join(differences)}")
