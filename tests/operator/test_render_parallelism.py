"""Tensor parallelism in the rendered children: GPUs and flags per pod, a Deployment on one node, a
LeaderWorkerSet whose leader serves and whose workers compute when a replica spans nodes."""

from __future__ import annotations

import argparse

import pytest
from kubernetes_schema import lws_crd_schema, validate, validate_leader_worker_set
from operator_specs import NAME, NS, UID, spec
from pagoda_operator.leader_worker_set import LABEL_WORKER_INDEX
from pagoda_operator.names import GROUP_SET_MAX_LENGTH, group_set_name, selector_labels, variant_object_name
from pagoda_operator.plan import Checkpoint, plan_service
from pagoda_operator.render import RenderOptions, render, runtime_args
from pagoda_operator.status import compute_status
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pydantic import ValidationError

MODEL = {"source": "pvc://models/llama-3-70b", "family": "llama-3-70b"}
FOUR_GPUS = dict(model=MODEL, resources={"gpus": 4, "gpuMemory": "80Gi"})
TWO_NODES = dict(
    model=MODEL,
    resources={"gpus": 4, "gpuMemory": "80Gi"},
    parallelism={"nodes": 2},
    variants=[{"name": "bf16", "replicas": {"min": 1, "max": 3}}],
    networkPolicy={"enabled": True},
)


def objects(s) -> dict[tuple[str, str], dict]:
    rendered = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_four_gpus_on_one_node_are_one_deployment_pod_with_four_ranks():
    children = objects(spec(**FOUR_GPUS))
    assert not [kind for kind, _ in children if kind == "LeaderWorkerSet"]
    (container,) = children[("Deployment", variant_object_name(NAME, "bf16"))]["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert flag(container["args"], "--tensor-parallel-size") == "4"
    assert flag(container["args"], "--distributed-port") == "29500"
    for obj in children.values():
        validate(obj)


def test_one_gpu_pods_keep_their_arguments():
    """An operator upgrade must not restart every existing single-GPU Deployment."""
    (container,) = objects(spec())[("Deployment", variant_object_name(NAME, "bf16"))]["spec"]["template"][
        "spec"
    ]["containers"]
    assert "--tensor-parallel-size" not in container["args"]


def test_a_replica_spanning_two_nodes_is_a_leader_worker_set_group():
    children = objects(spec(**TWO_NODES))
    assert not [kind for kind, _ in children if kind == "Deployment"]
    lws = children[("LeaderWorkerSet", group_set_name(NAME, "bf16"))]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    assert "replicas" not in lws["spec"]  # the replicas field manager owns it
    (leader,) = template["leaderTemplate"]["spec"]["containers"]
    (worker,) = template["workerTemplate"]["spec"]["containers"]
    for container in (leader, worker):
        assert flag(container["args"], "--tensor-parallel-size") == "8"
        assert flag(container["args"], "--distributed-port") == "29500"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert leader["args"] == worker["args"]
    # The leader serves and is probed (ready only once every rank joined); workers only compute.
    assert {p["name"] for p in leader["ports"]} == {"http", "distributed"}
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert "ports" not in worker and "readinessProbe" not in worker and "livenessProbe" not in worker
    for role in ("leaderTemplate", "workerTemplate"):
        assert template[role]["metadata"]["labels"].items() >= selector_labels(NAME, "bf16").items()


def test_leader_worker_set_is_valid_against_the_pod_schema_and_its_crd():
    lws = objects(spec(**TWO_NODES))[("LeaderWorkerSet", group_set_name(NAME, "bf16"))]
    schema = lws_crd_schema()
    validate_leader_worker_set(lws, schema)
    if schema is None:
        pytest.skip("the LeaderWorkerSet module is not in the Go module cache: pod templates checked only")


def test_services_route_to_leaders_hpa_scales_groups_pdb_covers_every_pod():
    children = objects(spec(**TWO_NODES))
    child = variant_object_name(NAME, "bf16")
    assert children[("Service", child)]["spec"]["selector"] == {
        **selector_labels(NAME, "bf16"),
        LABEL_WORKER_INDEX: "0",
    }
    assert children[("HorizontalPodAutoscaler", child)]["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": group_set_name(NAME, "bf16"),
    }
    assert children[("PodDisruptionBudget", child)]["spec"]["selector"]["matchLabels"] == selector_labels(
        NAME, "bf16"
    )
    # The LeaderWorkerSet's own headless Service must not clash with the variant's Service.
    assert group_set_name(NAME, "bf16") != child
    for kind, obj in children.items():
        if kind[0] != "LeaderWorkerSet":
            validate(obj)


def test_network_policy_lets_the_ranks_of_a_group_reach_each_other():
    policy = objects(spec(**TWO_NODES))[("NetworkPolicy", NAME)]
    assert {"from": [{"podSelector": {"matchLabels": selector_labels(NAME)}}]} in policy["spec"]["ingress"]


def test_group_set_names_stay_short_enough_for_their_pods_labels():
    name = group_set_name("a" * 63, "v" * 20)
    assert len(name) <= GROUP_SET_MAX_LENGTH and name[0].isalpha()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"resources": {"gpus": 4}, "parallelism": {"tensor": 4, "nodes": 2}},
            "parallelism.tensor must equal resources.gpus x parallelism.nodes",
        ),
        ({"resources": {"gpus": 0}, "parallelism": {"nodes": 2}}, "parallelism.nodes above 1 needs GPU pods"),
        ({"resources": {"gpus": 9}}, "less than or equal to 8"),
        (
            {
                "model": {
                    "source": "hf://org/m",
                    "revision": "a" * 40,
                    "cache": {"accessMode": "ReadWriteOnce"},
                },
                "parallelism": {"nodes": 2},
            },
            "parallelism.nodes above 1 needs model.cache.accessMode ReadWriteMany",
        ),
    ],
)
def test_parallel_sizes_that_cannot_be_served_are_refused(changes, message):
    with pytest.raises(ValidationError, match=message):
        spec(**changes)


def test_a_family_whose_heads_do_not_split_gets_no_pods_and_the_status_names_the_sizes_that_do():
    # Judged from the catalogue, not by a CEL rule per family: the apiserver accepts the spec.
    s = spec(model=MODEL, resources={"gpus": 3})
    plan = plan_service(s)
    assert not plan.servable
    st = compute_status(
        plan, namespace=NS, name=NAME, generation=1, deployments=[], pods=[], previous=None, now="t"
    )
    conditions = {c.type: c for c in st.conditions}
    assert conditions["Ready"].reason == "InvalidParallelism"
    assert conditions["Ready"].message == (
        "variant bf16: parallelism.tensor 3 (resources.gpus x parallelism.nodes) does not split the model "
        "evenly over its ranks (attention heads, key/value heads, MLP); use one of 1, 2, 4, 8, 16, 32, 64"
    )


def test_a_mixture_of_experts_family_splits_by_its_experts_channels():
    # Qwen3-30B-A3B: 32 query heads, 4 KV heads, 768 channels per expert.
    moe = {"source": "pvc://models/qwen3-30b-a3b", "family": "qwen3-30b-a3b"}
    assert plan_service(spec(model=moe, resources={"gpus": 8})).servable
    three = plan_service(spec(model=moe, resources={"gpus": 3}))
    assert "use one of 1, 2, 4, 8, 16, 32" in three.variants[0].split_error


def test_70b_in_bf16_fits_four_80gib_gpus_but_not_one():
    def fit(gpus):
        s = spec(model=MODEL, resources={"gpus": gpus, "gpuMemory": "80Gi"})
        return plan_service(s).variants[0].fit

    four, one = fit(4), fit(1)
    assert four.fits and not one.fits
    # Each GPU holds a quarter of the projections (embeddings and LM head split by vocabulary too)
    # and the all-reduce buffers come on top.
    assert four.weight_bytes < one.weight_bytes / 3.9
    assert four.all_reduce_bytes > 0 == one.all_reduce_bytes
    assert four.kv_bytes * 4 == one.kv_bytes


def test_a_checkpoint_that_does_not_split_gets_no_pods_and_the_status_says_why():
    s = spec(
        model={"source": "hf://org/m", "revision": "a" * 40},
        resources={"gpus": 2},
        parallelism={"nodes": 2},
    )
    plan = plan_service(s, Checkpoint(KNOWN_ARCHITECTURES["smollm2-135m"]))  # 9 heads, 3 KV heads
    assert not plan.servable
    rendered = render(plan, namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    assert not [o for o in rendered if o["kind"] == "LeaderWorkerSet"]
    st = compute_status(
        plan, namespace=NS, name=NAME, generation=1, deployments=[], pods=[], previous=None, now="t"
    )
    conditions = {c.type: c for c in st.conditions}
    expected = (
        "variant bf16: parallelism.tensor 4 (resources.gpus x parallelism.nodes) does not split the model "
        "evenly over its ranks (attention heads, key/value heads, MLP); use one of 1, 3"
    )
    assert conditions["Degraded"].reason == conditions["Ready"].reason == "InvalidParallelism"
    assert conditions["Degraded"].message == expected
    assert group_set_name(NAME, "bf16") not in str(rendered)


def test_parallel_arguments_parse_with_the_runtime_cli():
    cli = pytest.importorskip("pagoda_runtime.cli")
    parser = argparse.ArgumentParser()
    cli._add_serve(parser.add_subparsers(dest="command"))
    s = spec(**TWO_NODES)
    parsed = parser.parse_args(runtime_args(s, s.variants[0], "llama"))
    assert parsed.tensor_parallel_size == 8 and parsed.distributed_port == 29500
