"""spec.route → one Gateway API HTTPRoute (gateway.networking.k8s.io/v1). Pure.

Rules, most specific first (the Gateway picks the longest matching prefix):

- one per variant, `/<name>/<variant>` rewritten to `/`: a client pins a variant with its base URL
  (`<gateway>/<name>/<variant>/v1`);
- the shared one, `route.path` (`/<name>` when unset) rewritten to `/`: with variants[].traffic its
  backends are the variants' Services weighted by those percents, so a canary gets exactly its
  share whatever its pod count; without, the InferenceService's Service, which spreads requests over
  every pod as it always has.

Each rule also sets VARIANT_ROUTES_HEADER, every variant's model name and path: a pod asked for a
sibling's `NAME:VARIANT` answers 307 to that path (the runtime's server/admission.py), which is how
a model name reaches its variant through a gateway that routes on paths and headers only. Changing
the weights rewrites this object alone; no pod restarts.

The labels and the `http` port of the variants' pods and Services are the ones the Gateway API
Inference Extension's InferencePool selects (docs/operator.md).
"""

from __future__ import annotations

from pagoda_runtime.contract.names import VARIANT_ROUTES_HEADER

from pagoda_operator.models import InferenceServiceSpec, RouteSpec
from pagoda_operator.names import PORT, variant_model_names, variant_object_name
from pagoda_operator.plan import ServicePlan

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
HTTP_ROUTE_KIND = "HTTPRoute"
HTTP_ROUTE_API = (GATEWAY_GROUP, GATEWAY_VERSION, "httproutes")


def route_path(name: str, route: RouteSpec) -> str:
    """The shared rule's prefix."""
    return route.path or f"/{name}"


def variant_path(name: str, variant: str) -> str:
    return f"/{name}/{variant}"


def _rewritten_to_root(prefix: str) -> list[dict]:
    if prefix.rstrip("/") == "":
        return []
    return [
        {
            "type": "URLRewrite",
            "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}},
        }
    ]


def _backend(service: str, weight: int | None = None) -> dict:
    ref = {"group": "", "kind": "Service", "name": service, "port": PORT}
    return ref if weight is None else {**ref, "weight": weight}


def _rule(prefix: str, backends: list[dict], routes_header: str) -> dict:
    header = {
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": VARIANT_ROUTES_HEADER, "value": routes_header}]},
    }
    return {
        "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
        "filters": [*_rewritten_to_root(prefix), header],
        "backendRefs": backends,
    }


def parent_ref(route: RouteSpec) -> dict:
    ref = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": route.gateway_ref.name}
    if route.gateway_ref.namespace:
        ref["namespace"] = route.gateway_ref.namespace
    if route.gateway_ref.section_name:
        ref["sectionName"] = route.gateway_ref.section_name
    return ref


def rules_reaching(plan: ServicePlan, variant: str) -> tuple[int, ...]:
    """Indices in the route's rules of the ones that may send a request to this variant: its own
    and the shared one (the last). A gateway's request counters per rule tell its demand."""
    names = [v.name for v in plan.servable]
    own = (names.index(variant),) if variant in names else ()
    return (*own, len(names))


def http_route(plan: ServicePlan, *, metadata: dict, name: str, served_name: str) -> dict:
    """metadata: the object's own (named after the InferenceService)."""
    spec: InferenceServiceSpec = plan.spec
    route = spec.route
    variants = [v.variant for v in plan.servable]
    routes_header = ",".join(
        f"{variant_model_names(served_name, v.name)[1]}={variant_path(name, v.name)}" for v in variants
    )
    weighted = [
        _backend(variant_object_name(name, v.name), v.traffic) for v in variants if v.traffic is not None
    ]
    rules = [
        _rule(variant_path(name, v.name), [_backend(variant_object_name(name, v.name))], routes_header)
        for v in variants
    ]
    rules.append(_rule(route_path(name, route), weighted or [_backend(name)], routes_header))
    return {
        "apiVersion": f"{GATEWAY_GROUP}/{GATEWAY_VERSION}",
        "kind": HTTP_ROUTE_KIND,
        "metadata": metadata,
        "spec": {
            "parentRefs": [parent_ref(route)],
            **({"hostnames": list(route.hostnames)} if route.hostnames else {}),
            "rules": rules,
        },
    }
