"""An autoscaled variant → one KEDA ScaledObject (keda.sh/v1alpha1). Pure.

KEDA queries Prometheus itself (no custom metrics adapter) and feeds the HorizontalPodAutoscaler it
creates, `keda-hpa-<this object's name>`, which scales the variant's Deployment (or
LeaderWorkerSet) through its scale subresource, as the operator's own HPA does; the operator
still applies spec.replicas only to raise it to replicas.min (replicas.py), so the two never fight.

- `queue`: the variant's waiting requests summed over its pods (each pod counted once however many
  scrape jobs see it), AverageValue against autoscaling.targetQueueDepth: the HPA's rule.
- `demand`, for a variant that scales to zero: requests the gateway received in the last minute on
  the variant's own route rule or the shared one, plus requests its pods still run. A variant at
  zero has no pod to report a queue; the gateway still sees the request it holds or answers 503
  with Retry-After, so that request wakes the variant. The count is the gateway's request counter
  now minus a minute ago, not rate(): a counter series born with the first request at zero (its
  status code never seen before) would show no rate until a second request came. Its threshold is
  out of reach: it only activates (0 ↔ 1), the queue sizes.
- `cooldownPeriod` is autoscaling.scaleToZeroAfterSeconds, and `initialCooldownPeriod` the pods'
  startup timeout, so a first model load is never cut short by an idle verdict.
- `fallback`: when Prometheus cannot be queried three times running, keep the current replicas and
  at least max(min, 1) — an outage of monitoring never takes capacity away.
"""

from __future__ import annotations

from pagoda_runtime.contract.names import REQUESTS_RUNNING, REQUESTS_WAITING

from pagoda_operator.leader_worker_set import LWS_API_VERSION, LWS_KIND
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.names import variant_object_name, workload_name
from pagoda_operator.plan import VariantPlan
from pagoda_operator.scaling_behavior import behavior
from pagoda_operator.settings import KedaSettings

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
SCALED_OBJECT_KIND = "ScaledObject"
SCALED_OBJECT_API = (KEDA_GROUP, KEDA_VERSION, "scaledobjects")

FALLBACK_FAILURES = 3
# The demand trigger's per-pod target: unreachable, so that it activates the variant and never sizes it.
_ACTIVATION_ONLY = "1000000"


def _pods(spec: InferenceServiceSpec, name: str, variant: str) -> str:
    """A regex of the variant's serving pods' names: a Deployment's, or a LeaderWorkerSet's leaders."""
    if spec.spans_nodes:
        return f"{workload_name(name, variant, spans_nodes=True)}-[0-9]+"
    return f"{variant_object_name(name, variant)}-[a-z0-9]+-[a-z0-9]+"


def _per_pod_sum(metric: str, namespace: str, pods: str) -> str:
    return f'sum(max by (pod) ({metric}{{namespace="{namespace}",pod=~"{pods}"}}))'


def _prometheus(name: str, url: str, query: str, threshold: str, activation: str = "0") -> dict:
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": url,
            "query": query,
            "threshold": threshold,
            "activationThreshold": activation,
            "ignoreNullValues": "true",
        },
    }


def demand_query(
    settings: KedaSettings, *, namespace: str, route: str, rules: tuple[int, ...], pods: str
) -> str:
    """Requests the gateway received on these rules of the route in the last minute, plus requests
    the variant's pods are running; 0, not empty, when there are none."""
    counter = settings.request_counter.format(
        namespace=namespace, route=route, rules="(" + "|".join(map(str, rules)) + ")"
    )
    arrived = f"clamp_min((sum({counter}) or vector(0)) - (sum({counter} offset 1m) or vector(0)), 0)"
    return f"{arrived} + ({_per_pod_sum(REQUESTS_RUNNING, namespace, pods)} or vector(0))"


def scaled_object(
    spec: InferenceServiceSpec,
    plan: VariantPlan,
    *,
    metadata: dict,
    namespace: str,
    name: str,
    settings: KedaSettings,
    route_rules: tuple[int, ...] = (),
) -> dict:
    """route_rules: the HTTPRoute rules that reach this variant (http_route.rules_reaching)."""
    variant = plan.variant
    scaling = spec.autoscaling
    replicas = variant.replicas
    pods = _pods(spec, name, variant.name)
    triggers = [
        _prometheus(
            "queue",
            settings.prometheus_url,
            _per_pod_sum(REQUESTS_WAITING, namespace, pods),
            str(scaling.target_queue_depth),
        )
    ]
    body = {
        "scaleTargetRef": (
            {
                "apiVersion": LWS_API_VERSION,
                "kind": LWS_KIND,
                "name": workload_name(name, variant.name, spans_nodes=True),
            }
            if spec.spans_nodes
            else {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": variant_object_name(name, variant.name),
            }
        ),
        "pollingInterval": scaling.polling_interval_seconds,
        "minReplicaCount": replicas.min,
        "maxReplicaCount": replicas.max,
        "fallback": {
            "failureThreshold": FALLBACK_FAILURES,
            "replicas": max(replicas.min, 1),
            "behavior": "currentReplicasIfHigher",
        },
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(scaling)}},
    }
    if replicas.min == 0:
        query = demand_query(settings, namespace=namespace, route=name, rules=route_rules, pods=pods)
        triggers.append(_prometheus("demand", settings.prometheus_url, query, _ACTIVATION_ONLY))
        body["cooldownPeriod"] = scaling.scale_to_zero_after_seconds
        body["initialCooldownPeriod"] = spec.runtime.startup_timeout_seconds
    return {
        "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
        "kind": SCALED_OBJECT_KIND,
        "metadata": metadata,
        "spec": {**body, "triggers": triggers},
    }
