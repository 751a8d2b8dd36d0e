"""Names and labels of everything the operator creates, and the URL clients use: one place, so that
render, status, prune and the handlers' watches agree on which object belongs to which variant."""

from __future__ import annotations

import hashlib
import re

from pagoda_runtime.contract.names import HTTP_PORT

from pagoda_operator.models import GROUP
from pagoda_operator.rules import Rule

PORT = HTTP_PORT  # the runtime's default --port, rendered all the same
LABEL_ISVC = f"{GROUP}/inference-service"
LABEL_VARIANT = f"{GROUP}/variant"
# The labels Prometheus gives a runtime pod's series from those two pod labels (kubernetes_sd's
# labelmap of __meta_kubernetes_pod_label_*, the ServiceMonitor's podTargetLabels): the dashboard
# and KEDA's queries select an InferenceService and a variant by them.
PROMETHEUS_ISVC_LABEL = re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_ISVC)
PROMETHEUS_VARIANT_LABEL = re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_VARIANT)
# On the shared model cache's claim, Job and every replica that reads it (see model_cache.py).
LABEL_MODEL_CACHE = f"{GROUP}/model-cache"
# On each adapter's download Job into the namespace's adapter cache (see adapter_cache.py).
LABEL_ADAPTER_CACHE = f"{GROUP}/adapter-cache"
# The operator's own pods (charts/pagoda and manifests/ label them so): the NetworkPolicy of a
# service with adapters admits them, since the operator loads adapters through the runtime's API.
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "pagoda-operator"}
# The label Kubernetes sets on every namespace to its name, for selecting one namespace.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Where the operator runs when it is not told ($POD_NAMESPACE): the namespace of manifests/.
DEFAULT_OPERATOR_NAMESPACE = "pagoda-system"
# The InferenceService's name is its Service's name and a label value: a DNS-1035 label.
MAX_NAME_LENGTH = 63
_HASH_LENGTH = 6
# About the whole object, of which CEL may read metadata.name.
NAME_RULES = (
    Rule(
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        lambda name: len(name) <= MAX_NAME_LENGTH,
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters: it names the InferenceService's "
        "Service and labels its pods",
    ),
    Rule(
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        lambda name: re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None,
        "metadata.name must start with a letter and hold only lowercase letters, digits and '-': "
        "it names the InferenceService's Service",
    ),
)


def variant_object_name(name: str, variant: str) -> str:
    """`<name>-<variant>-<hash of both>`, the name cut short where needed to stay a DNS label.

    The hash keeps InferenceService `chat`'s variant `fp8` apart from InferenceService `chat-fp8`
    and from every other pair whose joined names read the same.
    """
    digest = hashlib.sha256(f"{name}/{variant}".encode()).hexdigest()[:_HASH_LENGTH]
    room = MAX_NAME_LENGTH - len(variant) - len(digest) - 2
    return f"{name[:room].rstrip('-')}-{variant}-{digest}"


# A LeaderWorkerSet names a headless Service after itself, which must not be the variant's Service,
# and its worker StatefulSets NAME-GROUP, whose pods' controller-revision-hash label (the StatefulSet's
# name and 11 more characters) must stay within a label value's 63.
GROUP_SET_MAX_LENGTH = 45
# The kinds whose pods serve a variant: one Deployment, or one LeaderWorkerSet when a replica spans nodes.
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


def group_set_name(name: str, variant: str) -> str:
    """The LeaderWorkerSet of a variant whose replicas span nodes: `<name>-<variant>-<hash>-lws`."""
    digest = hashlib.sha256(f"{name}/{variant}".encode()).hexdigest()[:_HASH_LENGTH]
    room = GROUP_SET_MAX_LENGTH - len(variant) - len(digest) - len("-lws") - 2
    return f"{name[:room].rstrip('-')}-{variant}-{digest}-lws"


def workload_name(name: str, variant: str, *, spans_nodes: bool) -> str:
    """The Deployment or, when a replica spans nodes, the LeaderWorkerSet that runs a variant's pods."""
    return group_set_name(name, variant) if spans_nodes else variant_object_name(name, variant)


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


def variant_model_names(served_name: str, variant: str) -> tuple[str, str]:
    """What a variant's pods answer to: the service's model name, and NAME:VARIANT for this one alone."""
    return served_name, f"{served_name}:{variant}"
