"""Names and labels of everything the operator creates, and the URL clients use: one place, so that
render, status, prune and the handlers' watches agree on which object belongs to which variant."""

from __future__ import annotations

from pagoda_operator.models import GROUP

PORT = 8000
LABEL_ISVC = f"{GROUP}/inference-service"
LABEL_VARIANT = f"{GROUP}/variant"


def variant_object_name(name: str, variant: str) -> str:
    return f"{name}-{variant}"


def service_url(name: str, namespace: str) -> str:
    return f"http://{name}.{namespace}.svc:{PORT}/v1"


def selector_labels(name: str, variant: str | None = None) -> dict[str, str]:
    labels = {LABEL_ISVC: name}
    if variant is not None:
        labels[LABEL_VARIANT] = variant
    return labels


def child_selector(name: str) -> str:
    """The label selector that finds every child (and pod) of one InferenceService."""
    return f"{LABEL_ISVC}={name}"


def labels(name: str, variant: str | None = None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pagoda-runtime",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/part-of": "pagoda",
        "app.kubernetes.io/managed-by": "pagoda-operator",
        **selector_labels(name, variant),
    }
