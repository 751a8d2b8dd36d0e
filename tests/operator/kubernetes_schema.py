"""Validation of rendered objects against the Kubernetes API types of the pinned client.

The kubernetes package's models are generated from the apiserver's OpenAPI schema and forbid
unknown fields with strict types, so parsing a manifest through them fails on a misspelled field
or a wrong type; serializing it back and comparing catches anything dropped on the way.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import jsonschema
import yaml
from kubernetes import client

VERSIONS_ENV = Path(__file__).resolve().parents[2] / "e2e" / "controlplane" / "versions.env"

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
    ("v1", "PodTemplate"): client.V1PodTemplate,
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


def _closed(schema: dict) -> dict:
    """An OpenAPI structural schema with unknown fields refused, as strict field validation does."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _closed(v) for k, v in out["properties"].items()}
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _closed(out["additionalProperties"])
    if "items" in out:
        out["items"] = _closed(out["items"])
    return out


def lws_crd_schema() -> dict | None:
    """The LeaderWorkerSet CRD's schema from the pinned module in the Go module cache (where the
    cluster suite's build put it); None where it is not there."""
    version = next(
        line.split("=", 1)[1].strip()
        for line in VERSIONS_ENV.read_text().splitlines()
        if line.startswith("LWS_VERSION=")
    )
    try:
        cache = (
            os.environ.get("GOMODCACHE")
            or subprocess.run(
                ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    crd = (
        Path(cache)
        / f"sigs.k8s.io/lws@{version}/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    )
    if not crd.is_file():
        return None
    loaded = yaml.load(crd.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (served,) = [v for v in loaded["spec"]["versions"] if v["name"] == "v1"]
    return _closed(served["schema"]["openAPIV3Schema"])


def validate_leader_worker_set(manifest: dict, schema: dict | None) -> None:
    """Both pod templates against the pinned client's PodTemplateSpec, the whole object against the
    LeaderWorkerSet CRD's schema when it is at hand."""
    template = manifest["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        validate(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": role},
                "template": template[role],
            }
        )
    if schema is not None:
        jsonschema.validate(manifest, schema)


def module_crd_schema(module: str, version_key: str, crd_path: str, served: str) -> dict | None:
    """A CRD's schema (version `served`) from a Go module pinned in versions.env (`version_key`),
    in the Go module cache where build.sh put it; None where it is not there."""
    version = next(
        line.split("=", 1)[1].strip()
        for line in VERSIONS_ENV.read_text().splitlines()
        if line.startswith(f"{version_key}=")
    )
    try:
        cache = (
            os.environ.get("GOMODCACHE")
            or subprocess.run(
                ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    crd = Path(cache) / f"{module}@{version}" / crd_path
    if not crd.is_file():
        return None
    loaded = yaml.load(crd.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (schema,) = [v["schema"]["openAPIV3Schema"] for v in loaded["spec"]["versions"] if v["name"] == served]
    return _closed(schema)
