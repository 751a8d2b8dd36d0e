"""Status from fabricated Deployments and Pods: conditions, replicas, URL, no needless writes."""

from __future__ import annotations

import pytest
from operator_specs import spec
from pagoda_operator.models import InferenceServiceStatus, VariantStatus
from pagoda_operator.names import group_set_name, variant_object_name
from pagoda_operator.plan import plan_service
from pagoda_operator.status import compute_status, invalid_status, status_changed, status_patch
from pydantic import ValidationError

NS, NAME = "ml", "llama"
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
TWO = [{"name": "bf16"}, {"name": "int4", "quantization": "int4"}]


def dep(variant, *, desired=1, ready=1, updated=None, generation=1, observed=1):
    return {
        "metadata": {"name": variant_object_name(NAME, variant), "generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "replicas": desired,
            "readyReplicas": ready,
            "updatedReplicas": desired if updated is None else updated,
            "observedGeneration": observed,
        },
    }


def waiting_pod(variant, reason, message="", last_message=""):
    status = {"name": "runtime", "state": {"waiting": {"reason": reason, "message": message}}}
    if last_message:
        status["lastState"] = {"terminated": {"exitCode": 1, "message": last_message}}
    return {
        "metadata": {"name": f"{NAME}-{variant}-abc", "labels": {"pagoda.dev/variant": variant}},
        "status": {"containerStatuses": [status]},
    }


def status(s, deployments, pods=(), previous=None, now=T0, generation=3, **observed):
    """The status as the operator writes it: the JSON of the merge patch."""
    return status_patch(
        compute_status(
            plan_service(s),
            namespace=NS,
            name=NAME,
            generation=generation,
            deployments=list(deployments),
            pods=list(pods),
            previous=previous,
            now=now,
            **observed,
        )
    )


def cond(st, type_):
    return next(c for c in st["conditions"] if c["type"] == type_)


def test_ready_when_every_variant_has_ready_pods():
    st = status(spec(variants=TWO), [dep("bf16"), dep("int4", desired=2, ready=2)])
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "Progressing")["status"] == "False"
    assert cond(st, "Degraded")["status"] == "False"
    assert st["url"] == "http://llama.ml.svc:8000/v1"
    assert st["observedGeneration"] == 3
    # Each variant's own Service and the model names its pods answer to; no path without a route.
    assert st["variants"] == [
        {
            "name": "bf16",
            "replicas": 1,
            "readyReplicas": 1,
            "service": variant_object_name(NAME, "bf16"),
            "modelNames": ["llama", "llama:bf16"],
        },
        {
            "name": "int4",
            "replicas": 2,
            "readyReplicas": 2,
            "service": variant_object_name(NAME, "int4"),
            "modelNames": ["llama", "llama:int4"],
        },
    ]
    assert st["variantNames"] == "bf16,int4" and st["replicaSummary"] == "3/3"
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_not_ready_and_progressing_while_a_variant_starts():
    st = status(spec(variants=TWO), [dep("bf16"), dep("int4", ready=0)])
    assert cond(st, "Ready")["status"] == "False"
    assert "int4" in cond(st, "Ready")["message"]
    assert cond(st, "Progressing")["status"] == "True"
    missing = status(spec(variants=TWO), [dep("bf16")])
    assert (
        cond(missing, "Progressing")["status"] == "True" and "int4" in cond(missing, "Progressing")["message"]
    )


def test_a_rollout_is_progressing_but_still_ready():
    st = status(spec(), [dep("bf16", desired=2, ready=2, updated=1, generation=2, observed=2)])
    assert cond(st, "Progressing")["status"] == "True"
    assert cond(st, "Ready")["status"] == "True"


def test_crash_loop_surfaces_the_runtime_termination_message():
    pod = waiting_pod(
        "bf16",
        "CrashLoopBackOff",
        "back-off 5m0s",
        last_message="model '/models/x' not found: give a Hugging Face model folder",
    )
    st = status(spec(), [dep("bf16", ready=0)], [pod])
    degraded = cond(st, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoopBackOff"
    assert "model '/models/x' not found" in degraded["message"]
    assert cond(st, "Ready")["reason"] == "CrashLoopBackOff"


def test_image_pull_and_unschedulable_are_degraded():
    pulled = status(
        spec(), [dep("bf16", ready=0)], [waiting_pod("bf16", "ImagePullBackOff", "pull access denied")]
    )
    assert cond(pulled, "Degraded")["reason"] == "ImagePullBackOff"
    assert "pull access denied" in cond(pulled, "Degraded")["message"]
    pending = {
        "metadata": {"name": "llama-bf16-x", "labels": {"pagoda.dev/variant": "bf16"}},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ]
        },
    }
    st = status(spec(), [dep("bf16", ready=0)], [pending])
    assert cond(st, "Degraded")["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond(st, "Degraded")["message"]


def test_a_starting_pod_is_not_degraded():
    st = status(spec(), [dep("bf16", ready=0)], [waiting_pod("bf16", "ContainerCreating")])
    assert cond(st, "Degraded")["status"] == "False"
    assert cond(st, "Ready")["reason"] == "Starting"


def test_model_fits_true_false_and_unknown():
    fitting = spec(model={"source": "pvc://m/x", "family": "llama-3-8b"}, resources={"gpuMemory": "80Gi"})
    assert cond(status(fitting, [dep("bf16")]), "ModelFits")["status"] == "True"
    unknown = status(spec(), [dep("bf16")])
    assert cond(unknown, "ModelFits")["status"] == "Unknown"
    assert "model.family" in cond(unknown, "ModelFits")["message"]

    too_big = spec(
        model={"source": "pvc://m/x", "family": "llama-3-70b"}, variants=TWO, resources={"gpuMemory": "80Gi"}
    )
    st = status(too_big, [dep("int4")])
    fits = cond(st, "ModelFits")
    assert fits["status"] == "False" and fits["reason"] == "InsufficientMemory"
    assert "bf16" in fits["message"] and "GiB" in fits["message"] and "int4" not in fits["message"]
    # A variant that gets no pods has no Service either.
    assert {
        "name": "bf16",
        "replicas": 0,
        "readyReplicas": 0,
        "fits": False,
        "modelNames": ["llama", "llama:bf16"],
    } in st["variants"]
    # The variant that fits serves; the one that cannot does not hold Ready back.
    assert cond(st, "Ready")["status"] == "True"


def test_nothing_fits_is_not_ready():
    s = spec(model={"source": "pvc://m/x", "family": "llama-3-70b"}, resources={"gpuMemory": "24Gi"})
    st = status(s, [])
    assert cond(st, "Ready")["status"] == "False" and cond(st, "Ready")["reason"] == "NoVariantFits"


def test_recomputing_a_settled_status_changes_nothing():
    s = spec(variants=TWO)
    first = status(s, [dep("bf16"), dep("int4")], now=T0)
    again = status(s, [dep("bf16"), dep("int4")], previous=first, now=T1)
    assert again == first and not status_changed(first, again)


def test_transition_time_moves_only_when_the_status_does():
    s = spec()
    starting = status(s, [dep("bf16", ready=0)], now=T0)
    ready = status(s, [dep("bf16")], previous=starting, now=T1)
    assert status_changed(starting, ready)
    assert cond(ready, "Ready")["lastTransitionTime"] == T1
    assert cond(ready, "Degraded")["lastTransitionTime"] == T0


def test_children_failures_are_degraded_with_their_own_reason():
    failing = dep("bf16", ready=0)
    failing["status"]["conditions"] = [
        {
            "type": "ReplicaFailure",
            "status": "True",
            "reason": "FailedCreate",
            "message": 'pods "x" is forbidden: no PriorityClass with name inference-high was found',
        }
    ]
    st = status(spec(), [failing])
    assert (cond(st, "Degraded")["status"], cond(st, "Degraded")["reason"]) == ("True", "FailedCreate")
    assert "no PriorityClass with name inference-high" in cond(st, "Degraded")["message"]
    assert cond(st, "Ready")["reason"] == "FailedCreate"

    hpa = {
        "metadata": {"name": "llama-bf16-x"},
        "status": {
            "conditions": [
                {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric", "message": "no"}
            ]
        },
    }
    st = status(spec(), [dep("bf16")], hpas=[hpa], generation=1)
    assert cond(st, "Degraded")["reason"] == "FailedGetPodsMetric"
    assert cond(st, "Ready")["status"] == "True"


def test_a_name_clash_is_degraded_and_not_ready_and_names_the_object():
    st = status(spec(), [dep("bf16")], clashes=["Service ml/llama"], generation=1)
    assert cond(st, "Degraded")["reason"] == cond(st, "Ready")["reason"] == "NameClash"
    assert cond(st, "Degraded")["message"].startswith("Service ml/llama exists and does not belong")


def test_invalid_status_keeps_the_other_conditions_and_the_transition_rule():
    settled = status(spec(), [dep("bf16")], now=T0)
    invalid = status_patch(invalid_status(settled, reason="InvalidSpec", message="bad", generation=4, now=T1))
    # Only the conditions and the generation: the merge patch keeps the rest as stored.
    assert set(invalid) == {"conditions", "observedGeneration"}
    ready = cond(invalid, "Ready")
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == ("False", "InvalidSpec", T1)
    again = status_patch(
        invalid_status(invalid, reason="InvalidSpec", message="bad", generation=4, now="later")
    )
    assert cond(again, "Ready")["lastTransitionTime"] == T1
    assert cond(invalid, "ModelFits") == cond(settled, "ModelFits")


def test_a_variant_spanning_nodes_reads_ready_groups_from_its_leader_worker_set():
    s = spec(resources={"gpus": 4}, parallelism={"nodes": 2}, variants=[{"name": "bf16"}])
    lws = dep("bf16", desired=2, ready=0)
    lws["metadata"]["name"] = group_set_name(NAME, "bf16")
    st = status(s, [lws])
    assert cond(st, "Ready")["reason"] == "Starting"
    lws["status"]["readyReplicas"] = 1
    st = status(s, [lws])
    assert cond(st, "Ready")["status"] == "True"
    assert [(v["name"], v["replicas"], v["readyReplicas"]) for v in st["variants"]] == [("bf16", 2, 1)]
    assert st["replicaSummary"] == "1/2"


def test_the_written_status_is_the_typed_one_and_clears_what_no_longer_applies():
    st = status(spec(variants=TWO), [dep("bf16"), dep("int4", ready=0)])
    assert status_patch(InferenceServiceStatus.model_validate(st)) == st
    # null removes a stored retiring or modelCache in a merge patch; an unknown fit is left out.
    assert st["retiring"] is None and st["modelCache"] is None
    assert all("fits" not in v for v in st["variants"])
    retiring = {"since": T0, "deployments": ["llama-old-abc123"]}
    replacing = status(spec(), [dep("bf16")], retiring=retiring)
    assert (
        replacing["retiring"] == retiring and cond(replacing, "Progressing")["reason"] == "ReplacingVariants"
    )


def test_a_misspelled_status_field_is_an_error_not_a_dropped_field():
    with pytest.raises(ValidationError, match="readyReplica"):
        VariantStatus(name="bf16", readyReplica=1)
    with pytest.raises(ValidationError, match="deployment"):
        status(spec(), [dep("bf16")], retiring={"since": T0, "deployment": ["llama-old-abc123"]})


ROUTE = {"gatewayRef": {"name": "public", "namespace": "gateways"}}


def http_route(*conditions, gateway="public", gateway_namespace="gateways"):
    parent = {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": gateway,
        "namespace": gateway_namespace,
    }
    return {
        "status": {
            "parents": [
                {
                    "parentRef": parent,
                    "controllerName": "traefik.io/gateway-controller",
                    "conditions": [
                        {"type": t, "status": st, "reason": reason, "message": message}
                        for t, st, reason, message in conditions
                    ],
                }
            ]
        }
    }


def test_the_routes_conditions_at_its_gateway_become_the_inference_services():
    s = spec(variants=TWO, route=ROUTE)
    accepted = http_route(
        ("Accepted", "True", "Accepted", ""),
        ("ResolvedRefs", "False", "BackendNotFound", "service llama-int4 not found"),
    )
    st = status(s, [dep("bf16"), dep("int4")], route=accepted, gateway_api=True)
    assert (cond(st, "RouteAccepted")["status"], cond(st, "RouteAccepted")["reason"]) == ("True", "Accepted")
    refs = cond(st, "RouteResolvedRefs")
    assert (refs["status"], refs["reason"]) == ("False", "BackendNotFound")
    assert refs["message"] == "service llama-int4 not found"
    # Each variant's path on the gateway.
    assert [v["path"] for v in st["variants"]] == ["/llama/bf16", "/llama/int4"]
    # A route that another Gateway reported on, or none has yet: pending.
    elsewhere = http_route(("Accepted", "True", "Accepted", ""), gateway="other")
    for route in (elsewhere, None):
        pending = cond(status(s, [dep("bf16"), dep("int4")], route=route, gateway_api=True), "RouteAccepted")
        assert (pending["status"], pending["reason"]) == ("Unknown", "Pending")


def test_a_route_without_the_gateway_api_says_why_and_the_variants_still_serve():
    st = status(spec(variants=TWO, route=ROUTE), [dep("bf16"), dep("int4")], gateway_api=False)
    for type_ in ("RouteAccepted", "RouteResolvedRefs"):
        assert cond(st, type_)["status"] == "False"
        assert cond(st, type_)["reason"] == "GatewayAPIMissing"
        assert "docs/operator.md" in cond(st, type_)["message"]
    assert cond(st, "Ready")["status"] == "True"
    assert not any(
        c["type"].startswith("Route") for c in status(spec(variants=TWO), [dep("bf16")])["conditions"]
    )
