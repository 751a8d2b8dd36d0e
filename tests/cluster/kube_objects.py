"""Reading, writing and waiting on cluster objects through the pinned kubectl, as a user would."""

from __future__ import annotations

import json

import yaml

# The cluster tests import their polling helper from here; it is shared with tests/e2e.
from polling import wait_for  # noqa: F401

ISVC_LABEL = "pagoda.dev/inference-service"
CHILD_KINDS = "deployments,services,horizontalpodautoscalers,poddisruptionbudgets"


def get(cp, *args: str) -> dict:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def get_or_none(cp, *args: str) -> dict | None:
    found = cp.kubectl("get", *args, "-o", "json", "--ignore-not-found", check=False)
    return json.loads(found.stdout) if found.returncode == 0 and found.stdout.strip() else None


def apply(cp, namespace: str, manifest: dict | str) -> str:
    text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
    return cp.kubectl("apply", "-n", namespace, "-f", "-", input=text).stdout


def children(cp, namespace: str, name: str) -> dict[tuple[str, str], dict]:
    """The InferenceService's children by (kind, name), found by the label the operator sets."""
    items = get(cp, CHILD_KINDS, "-n", namespace, "-l", f"{ISVC_LABEL}={name}")["items"]
    return {(item["kind"], item["metadata"]["name"]): item for item in items}


def pods(cp, namespace: str, selector: str) -> list[dict]:
    return get(cp, "pods", "-n", namespace, "-l", selector)["items"]


def condition(obj: dict, type_: str) -> dict:
    found = [c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_]
    return found[0] if found else {}


def is_ready(pod: dict) -> bool:
    return condition(pod, "Ready").get("status") == "True"
