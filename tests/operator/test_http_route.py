"""spec.route → the HTTPRoute: paths per variant, the weighted split, the model-name header."""

from __future__ import annotations

import jsonschema
import pytest
from kubernetes_schema import module_crd_schema
from operator_specs import NAME, NS, UID, spec
from pagoda_operator.names import variant_object_name
from pagoda_operator.plan import plan_service
from pagoda_operator.render import RenderOptions, render
from pagoda_runtime.contract.names import VARIANT_ROUTES_HEADER
from pydantic import ValidationError

ROUTE = {"gatewayRef": {"name": "public", "namespace": "gateways"}, "hostnames": ["llm.example"]}
CANARY = [{"name": "bf16", "traffic": 95}, {"name": "int4", "quantization": "int4", "traffic": 5}]


def route(s, gateway_api=True) -> dict | None:
    rendered = render(
        plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions(gateway_api=gateway_api)
    )
    found = [o for o in rendered if o["kind"] == "HTTPRoute"]
    return found[0] if found else None


def rule(r: dict, prefix: str) -> dict:
    return next(x for x in r["spec"]["rules"] if x["matches"][0]["path"]["value"] == prefix)


def backends(r: dict, prefix: str) -> list[tuple[str, int | None]]:
    return [(b["name"], b.get("weight")) for b in rule(r, prefix)["backendRefs"]]


def test_weighted_variants_behind_the_shared_path_and_each_at_its_own():
    r = route(spec(variants=CANARY, route=ROUTE))
    assert r["metadata"]["name"] == NAME and r["metadata"]["ownerReferences"][0]["uid"] == UID
    assert r["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "gateways"}
    ]
    assert r["spec"]["hostnames"] == ["llm.example"]
    bf16, int4 = variant_object_name(NAME, "bf16"), variant_object_name(NAME, "int4")
    assert backends(r, "/llama") == [(bf16, 95), (int4, 5)]
    assert backends(r, "/llama/bf16") == [(bf16, None)]
    assert backends(r, "/llama/int4") == [(int4, None)]
    for prefix in ("/llama", "/llama/bf16", "/llama/int4"):
        filters = {f["type"]: f for f in rule(r, prefix)["filters"]}
        # /llama/int4/v1/models reaches the pod as /v1/models.
        assert filters["URLRewrite"]["urlRewrite"]["path"] == {
            "type": "ReplacePrefixMatch",
            "replacePrefixMatch": "/",
        }
        (header,) = filters["RequestHeaderModifier"]["requestHeaderModifier"]["set"]
        assert header == {
            "name": VARIANT_ROUTES_HEADER,
            "value": "llama:bf16=/llama/bf16,llama:int4=/llama/int4",
        }
    assert all(
        b["port"] == 8000 and b["kind"] == "Service" for x in r["spec"]["rules"] for b in x["backendRefs"]
    )


def test_without_weights_the_shared_path_spreads_over_every_pod_as_the_service_does():
    r = route(
        spec(
            variants=[{"name": "bf16"}, {"name": "int4", "quantization": "int4"}],
            route={**ROUTE, "path": "/"},
        )
    )
    assert backends(r, "/") == [(NAME, None)]
    assert "URLRewrite" not in {f["type"] for f in rule(r, "/")["filters"]}


def test_a_weight_change_rewrites_the_route_and_no_pod_template():
    before = render(
        plan_service(spec(variants=CANARY, route=ROUTE)),
        namespace=NS,
        name=NAME,
        uid=UID,
        options=RenderOptions(gateway_api=True),
    )
    moved = [{**CANARY[0], "traffic": 50}, {**CANARY[1], "traffic": 50}]
    after = render(
        plan_service(spec(variants=moved, route=ROUTE)),
        namespace=NS,
        name=NAME,
        uid=UID,
        options=RenderOptions(gateway_api=True),
    )
    changed = {o["kind"] for o, p in zip(before, after, strict=True) if o != p}
    assert changed == {"HTTPRoute"}


def test_no_route_without_the_gateway_api_or_without_spec_route():
    assert route(spec(variants=CANARY, route=ROUTE), gateway_api=False) is None
    assert route(spec()) is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"variants": [{"name": "a", "traffic": 90}, {"name": "b", "traffic": 20}], "route": ROUTE},
            "sum to 100",
        ),
        ({"variants": [{"name": "a", "traffic": 100}, {"name": "b"}], "route": ROUTE}, "sum to 100"),
        ({"variants": [{"name": "a", "traffic": 100}]}, "needs spec.route"),
        ({"variants": [{"name": "v1"}], "route": ROUTE}, "must not be named v1"),
    ],
)
def test_splits_that_cannot_be_made_are_refused(changes, message):
    with pytest.raises(ValidationError, match=message):
        spec(**changes)


def test_the_route_matches_the_gateway_api_crd():
    schema = module_crd_schema(
        "sigs.k8s.io/gateway-api",
        "GATEWAY_API_VERSION",
        "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml",
        "v1",
    )
    if schema is None:
        pytest.skip(
            "the sigs.k8s.io/gateway-api module is not in the Go module cache (e2e/controlplane/build.sh)"
        )
    jsonschema.validate(route(spec(variants=CANARY, route=ROUTE)), schema)
