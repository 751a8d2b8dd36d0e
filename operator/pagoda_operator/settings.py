"""What the platform team sets once for every InferenceService: the operator's flags (the chart's
values), read by the reconcile and passed into the pure render as RenderOptions."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda_operator.names import DEFAULT_OPERATOR_NAMESPACE

# The runtime image of an InferenceService that names none. Held by the operator, not stored in
# each object, so that upgrading the operator (its --runtime-image) moves every such runtime.
DEFAULT_RUNTIME_IMAGE = "pagoda-runtime:0.1.0"
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
# Traefik's request counter per router; its Kubernetes Gateway provider makes one router per rule of
# an HTTPRoute, `httproute-<namespace>-<route>-gw-<gateway>-ep-<entry point>-<rule index>-<hash>`.
# {namespace}, {route} and {rules} (a regex of rule indices) are filled in per variant.
DEFAULT_REQUEST_COUNTER = (
    'traefik_router_requests_total{{router=~"httproute-{namespace}-{route}-gw-.+-ep-.+-{rules}-[0-9a-f]+'
    '@kubernetesgateway"}}'
)


@dataclass(frozen=True)
class KedaSettings:
    """Where KEDA reads metrics: the cluster's Prometheus (--prometheus-url), and the gateway's
    counter of requests per HTTPRoute rule (--gateway-request-counter: a PromQL series selector with
    {namespace}, {route} and {rules})."""

    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    request_counter: str = DEFAULT_REQUEST_COUNTER


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    # Labels of every ServiceMonitor, for a Prometheus that selects them (kube-prometheus-stack:
    # release=<its release name>).
    service_monitor_labels: dict[str, str] = field(default_factory=dict)
    keda: KedaSettings = KedaSettings()
    # The namespaces watched (--namespace, globs allowed); none: every namespace.
    namespaces: tuple[str, ...] = ()
    # The operator's own namespace, whose operator pods a service's NetworkPolicy admits.
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE


_current = OperatorSettings()


def configure(settings: OperatorSettings) -> None:
    global _current
    _current = settings


def current() -> OperatorSettings:
    return _current
