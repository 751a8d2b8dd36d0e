"""KEDA ScaledObjects: the queue-depth trigger, scale to zero and its wake-up, fallback, cooldown."""

from __future__ import annotations

import jsonschema
import pytest
from kubernetes_schema import module_crd_schema
from operator_specs import NAME, NS, UID, spec
from pagoda_operator.names import group_set_name, variant_object_name
from pagoda_operator.plan import plan_service, plan_variant
from pagoda_operator.render import RenderOptions, render
from pagoda_operator.replicas import replicas_to_apply
from pagoda_operator.settings import KedaSettings
from pydantic import ValidationError

KEDA = KedaSettings(
    prometheus_url="http://prom:9090", request_counter='gw_requests{{rule=~"{namespace}/{route}/{rules}"}}'
)

ROUTE = {"gatewayRef": {"name": "public"}}


def rendered(s, keda=KEDA) -> dict[tuple[str, str], dict]:
    objects = render(
        plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions(keda=keda, gateway_api=True)
    )
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def scaled(s, variant="bf16") -> dict:
    return rendered(s)[("ScaledObject", variant_object_name(NAME, variant))]["spec"]


def trigger(so: dict, name: str) -> dict:
    return next(t for t in so["triggers"] if t["name"] == name)


def test_an_autoscaled_variant_gets_a_scaled_object_on_its_queue_depth_and_no_hpa():
    s = spec(
        variants=[{"name": "bf16", "replicas": {"min": 1, "max": 4}}], autoscaling={"targetQueueDepth": 3}
    )
    objects = rendered(s)
    assert not any(kind == "HorizontalPodAutoscaler" for kind, _ in objects)
    so = scaled(s)
    assert so["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": variant_object_name(NAME, "bf16"),
    }
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (1, 4)
    queue = trigger(so, "queue")
    assert queue["type"] == "prometheus" and queue["metricType"] == "AverageValue"
    meta = queue["metadata"]
    assert meta["serverAddress"] == "http://prom:9090" and meta["threshold"] == "3"
    pods = f"{variant_object_name(NAME, 'bf16')}-[a-z0-9]+-[a-z0-9]+"
    assert meta["query"] == f'sum(max by (pod) (pagoda_num_requests_waiting{{namespace="ml",pod=~"{pods}"}}))'
    # Prometheus down: keep what runs, and at least one pod.
    assert so["fallback"] == {"failureThreshold": 3, "replicas": 1, "behavior": "currentReplicasIfHigher"}
    assert so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60}
    ]
    assert [t["name"] for t in so["triggers"]] == ["queue"] and "cooldownPeriod" not in so


def test_a_variant_that_scales_to_zero_wakes_on_gateway_demand_after_its_first_load():
    s = spec(
        variants=[{"name": "bf16", "replicas": {"min": 0, "max": 2}}],
        route=ROUTE,
        autoscaling={"scaleToZeroAfterSeconds": 120, "pollingIntervalSeconds": 5},
        runtime={"startupTimeoutSeconds": 900},
    )
    so = scaled(s)
    assert so["minReplicaCount"] == 0 and so["pollingInterval"] == 5
    assert so["cooldownPeriod"] == 120 and so["initialCooldownPeriod"] == 900
    demand = trigger(so, "demand")["metadata"]
    assert demand["activationThreshold"] == "0" and float(demand["threshold"]) >= 1e6
    # Requests on its own rule (0) or the shared one (1) in the last minute: a difference, not a
    # rate, so that the first request at zero counts although its series is new.
    counter = 'gw_requests{rule=~"ml/llama/(0|1)"}'
    assert demand["query"].startswith(
        f"clamp_min((sum({counter}) or vector(0)) - (sum({counter} offset 1m) or vector(0)), 0) + "
    )
    assert "pagoda_num_requests_running" in demand["query"]
    assert so["fallback"]["replicas"] == 1
    # Created with one pod, so the model is loaded once; after that the autoscaler owns the count.
    plan = plan_variant(s, s.variants[0])
    assert replicas_to_apply(plan, None) == 1
    assert replicas_to_apply(plan, {"metadata": {}, "spec": {"replicas": 0}}) is None


def test_a_leader_worker_set_variant_scales_by_its_leaders():
    s = spec(
        resources={"gpus": 4},
        parallelism={"nodes": 2},
        variants=[{"name": "bf16", "replicas": {"min": 1, "max": 3}}],
    )
    so = scaled(s)
    lws = group_set_name(NAME, "bf16")
    assert so["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": lws,
    }
    assert f'pod=~"{lws}-[0-9]+"' in trigger(so, "queue")["metadata"]["query"]


def test_actuator_hpa_keeps_the_hpa_where_keda_is_installed():
    s = spec(variants=[{"name": "bf16", "replicas": {"min": 1, "max": 4}}], autoscaling={"actuator": "hpa"})
    objects = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions(keda=None))
    assert ("HorizontalPodAutoscaler", variant_object_name(NAME, "bf16")) in {
        (o["kind"], o["metadata"]["name"]) for o in objects
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"variants": [{"name": "a", "replicas": {"min": 0, "max": 2}}]}, "needs spec.route"),
        (
            {
                "variants": [{"name": "a", "replicas": {"min": 0, "max": 2}}],
                "route": ROUTE,
                "autoscaling": {"actuator": "hpa"},
            },
            "needs autoscaling.actuator keda",
        ),
    ],
)
def test_scale_to_zero_needs_a_route_and_keda(changes, message):
    with pytest.raises(ValidationError, match=message):
        spec(**changes)
    # A variant switched off (min = max = 0) needs neither.
    spec(variants=[{"name": "a", "replicas": {"min": 0, "max": 0}}])


def test_the_scaled_object_matches_kedas_crd():
    schema = module_crd_schema(
        "github.com/kedacore/keda/v2",
        "KEDA_VERSION",
        "config/crd/bases/keda.sh_scaledobjects.yaml",
        "v1alpha1",
    )
    if schema is None:
        pytest.skip("the KEDA module is not in the Go module cache (e2e/controlplane/build.sh)")
    s = spec(variants=[{"name": "bf16", "replicas": {"min": 0, "max": 2}}], route=ROUTE)
    jsonschema.validate(rendered(s)[("ScaledObject", variant_object_name(NAME, "bf16"))], schema)
