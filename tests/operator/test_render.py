"""render(): each spec feature → the manifest fields it must produce, all valid Kubernetes objects."""

from __future__ import annotations

import pytest
from kubernetes_schema import validate
from operator_specs import NAME, NS, UID, spec
from pagoda_operator.model_cache import cache_ref
from pagoda_operator.names import variant_object_name
from pagoda_operator.plan import plan_service, plan_variant
from pagoda_operator.render import RenderOptions, render, runtime_args
from pagoda_operator.replicas import replicas_to_apply


def child(variant: str) -> str:
    return variant_object_name(NAME, variant)


def objects(s, service_monitor=False) -> dict[tuple[str, str], dict]:
    rendered = render(
        plan_service(s),
        namespace=NS,
        name=NAME,
        uid=UID,
        options=RenderOptions(service_monitor=service_monitor),
    )
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered}


def deployment(s, variant="bf16") -> dict:
    return objects(s)[("Deployment", child(variant))]


def pod(s, variant="bf16") -> dict:
    return deployment(s, variant)["spec"]["template"]["spec"]


def container(s, variant="bf16") -> dict:
    return pod(s, variant)["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


REVISION = "e1945c40cd546c78e41f1151f4db032b271faeaa"
FULL = dict(
    model={
        "source": "hf://meta-llama/Meta-Llama-3-8B-Instruct",
        "servedName": "llama3",
        "maxModelLen": 4096,
        "family": "llama-3-8b",
        "revision": REVISION,
        "tokenSecretRef": {"name": "hf", "key": "token"},
        "cache": {"size": "40Gi", "storageClassName": "shared-rwx"},
    },
    runtime={
        "image": "r.example/pagoda-runtime:1",
        "imagePullSecrets": ["pull"],
        "maxQueue": 64,
        "apiKeySecretRef": {"name": "api", "key": "key"},
        "env": [{"name": "A", "value": "b"}],
        "extraArgs": ["--seed", "7"],
        "enablePrefixCaching": False,
    },
    variants=[
        {"name": "bf16", "replicas": {"min": 1, "max": 4}},
        {"name": "int4", "quantization": "int4", "kvCacheDtype": "fp8", "replicas": {"min": 2, "max": 2}},
    ],
    resources={
        "gpus": 1,
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpuMemory": "80Gi",
        "cpu": 8,
        "memory": "64Gi",
    },
    scheduling={
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "priorityClassName": "high",
    },
)


@pytest.mark.parametrize(
    "s",
    [
        spec(),
        spec(**FULL),
        spec(model={"source": "file:///models/x"}, resources={"gpus": 0, "memory": "4Gi"}),
        spec(model={"source": "bundled://smollm2-135m", "family": "smollm2-135m"}),
    ],
    ids=["minimal", "full", "cpu-file", "bundled"],
)
def test_every_rendered_object_is_a_valid_kubernetes_object(s):
    for (kind, _), obj in objects(s).items():
        if kind != "ServiceMonitor":
            validate(obj)


def test_the_validator_rejects_a_misspelled_field_and_a_wrong_type():
    good = deployment(spec())
    bad_name = {**good, "spec": {**good["spec"], "replicaz": 1}}
    with pytest.raises(ValueError, match="replicaz"):
        validate(bad_name)
    bad_port = objects(spec())[("Service", NAME)]
    bad_port["spec"]["ports"][0]["port"] = "8000"
    with pytest.raises(ValueError, match="port"):
        validate(bad_port)


def test_children_per_variant_and_one_service_over_all():
    kinds = sorted(objects(spec(**FULL)))
    assert kinds == sorted(
        [
            ("Service", NAME),
            ("Deployment", child("bf16")),
            ("Service", child("bf16")),
            ("PodDisruptionBudget", child("bf16")),
            ("HorizontalPodAutoscaler", child("bf16")),  # min < max autoscales
            ("Deployment", child("int4")),
            ("Service", child("int4")),
            ("PodDisruptionBudget", child("int4")),
        ]
    )


def test_every_child_is_owned_and_labelled():
    for obj in objects(spec(**FULL), service_monitor=True).values():
        meta = obj["metadata"]
        assert meta["namespace"] == NS
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "pagoda.dev/v1alpha1",
            "kind": "InferenceService",
            "name": NAME,
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert meta["labels"]["pagoda.dev/inference-service"] == NAME
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "pagoda-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == NAME


def test_services_select_one_variant_or_all_of_them():
    objs = objects(spec(**FULL))
    assert objs[("Service", NAME)]["spec"]["selector"] == {"pagoda.dev/inference-service": NAME}
    selector = {"pagoda.dev/inference-service": NAME, "pagoda.dev/variant": "int4"}
    assert objs[("Service", child("int4"))]["spec"]["selector"] == selector
    dep = objs[("Deployment", child("int4"))]
    assert dep["spec"]["selector"]["matchLabels"] == selector
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert objs[("Service", NAME)]["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_runtime_arguments_follow_the_spec():
    s = spec(**FULL)
    c = container(s, "int4")
    args = c["args"]
    assert c["command"] == ["pagoda-runtime"] and args[0] == "serve"
    assert flag(args, "--model") == "/models/model"  # the shared cache, mounted read-only
    assert flag(args, "--served-model-name") == "llama3"
    assert flag(args, "--quantization") == "int4"
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert flag(container(s, "bf16")["args"], "--quantization") == "auto"
    assert flag(args, "--max-model-len") == "4096"
    assert flag(args, "--max-num-seqs") == "256"
    assert flag(args, "--max-num-batched-tokens") == "8192"
    assert flag(args, "--max-queue") == "64"
    assert flag(args, "--drain-timeout") == "120"
    assert flag(args, "--port") == "8000"
    assert flag(args, "--device") == "cuda"
    assert flag(args, "--termination-log") == "/dev/termination-log"
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert args[-2:] == ["--seed", "7"]  # extraArgs come last and so win
    env = {e["name"]: e for e in c["env"]}
    assert env["PAGODA_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "api", "key": "key"}}
    assert env["A"]["value"] == "b"


def test_runtime_arguments_parse_with_the_runtime_cli():
    cli = pytest.importorskip("pagoda_runtime.cli")
    import argparse

    parser = argparse.ArgumentParser()
    cli._add_serve(parser.add_subparsers(dest="command"))
    s = spec(**FULL)
    parsed = parser.parse_args(runtime_args(s, s.variants[1], "llama3"))
    assert parsed.quantization == "int4" and parsed.max_model_len == 4096
    assert parsed.kv_cache_dtype == "fp8"
    assert parsed.enable_prefix_caching is False and parsed.drain_timeout == 120


def test_defaults_omit_max_model_len_and_name_the_model_after_the_service():
    args = container(spec())["args"]
    assert "--max-model-len" not in args and "--max-queue" not in args
    assert flag(args, "--served-model-name") == NAME
    assert "--enable-prefix-caching" in args


def test_model_sources():
    pvc = pod(spec(model={"source": "pvc://models/llama/8b"}))
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pvc[
        "volumes"
    ]
    mount = next(m for m in pvc["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert flag(pvc["containers"][0]["args"], "--model") == "/models/llama/8b"
    assert "initContainers" not in pvc

    baked = pod(spec(model={"source": "file:///opt/models/x"}))
    assert flag(baked["containers"][0]["args"], "--model") == "/opt/models/x"
    assert all(v["name"] != "model" for v in baked["volumes"])

    bundled = pod(spec(model={"source": "bundled://smollm2-135m"}))
    assert flag(bundled["containers"][0]["args"], "--model") == "smollm2-135m"


def test_downloaded_sources_wait_for_the_shared_cache_and_mount_it_read_only():
    p = pod(spec(**FULL))
    (wait,) = p["initContainers"]
    assert wait["name"] == "wait-for-model" and wait["image"] == "r.example/pagoda-runtime:1"
    assert "/models/model/.pagoda-model.json" in wait["command"][-1]
    ref = cache_ref(spec(**FULL))
    assert {"name": "model", "persistentVolumeClaim": {"claimName": ref.name, "readOnly": True}} in p[
        "volumes"
    ]
    runtime = p["containers"][0]
    assert flag(runtime["args"], "--model") == "/models/model"
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in runtime["volumeMounts"]
    assert "podAffinity" not in p["affinity"]  # ReadWriteMany: replicas anywhere

    rwo = pod(spec(model={**FULL["model"], "cache": {"accessMode": "ReadWriteOnce"}}))
    term = rwo["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["labelSelector"]["matchLabels"] == {"pagoda.dev/model-cache": ref.key}


def test_gpu_resources_node_selector_and_toleration():
    p = pod(spec(**FULL))
    c = p["containers"][0]
    assert c["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
    }
    # Preferred: a cluster without NVIDIA's GPU feature discovery has no such label, and the pods
    # must schedule there all the same.
    assert p["nodeSelector"] == {"pool": "gpu"}
    (preferred,) = p["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in p["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in p[
        "tolerations"
    ]
    assert p["priorityClassName"] == "high"
    assert p["imagePullSecrets"] == [{"name": "pull"}]


def test_gpu_product_is_a_node_selector_only_when_required():
    required = pod(spec(**{**FULL, "resources": {**FULL["resources"], "gpuProductRequired": True}}))
    assert required["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert "affinity" not in required
    rwo = {**FULL["model"], "cache": {"accessMode": "ReadWriteOnce"}}
    both = pod(spec(**{**FULL, "model": rwo}))["affinity"]
    assert set(both) == {"nodeAffinity", "podAffinity"}


def test_the_runtime_image_is_the_operators_unless_the_spec_pins_one():
    unpinned = spec(model={"source": "hf://org/m", "revision": REVISION})
    options = RenderOptions(runtime_image="registry.example/pagoda-runtime:0.2.0")
    rendered = render(plan_service(unpinned), namespace=NS, name=NAME, uid=UID, options=options)
    template = next(o for o in rendered if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert template["containers"][0]["image"] == "registry.example/pagoda-runtime:0.2.0"
    assert template["initContainers"][0]["image"] == "registry.example/pagoda-runtime:0.2.0"
    assert unpinned.runtime.image is None  # nothing is stored in the object
    pinned = render(plan_service(spec(**FULL)), namespace=NS, name=NAME, uid=UID, options=options)
    template = next(o for o in pinned if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert template["containers"][0]["image"] == "r.example/pagoda-runtime:1"


def test_service_monitor_labels_come_from_the_operator_and_never_override_its_own():
    options = RenderOptions(
        service_monitor=True,
        service_monitor_labels=(("release", "kube-prometheus-stack"), ("pagoda.dev/inference-service", "x")),
    )
    rendered = render(plan_service(spec()), namespace=NS, name=NAME, uid=UID, options=options)
    monitor = next(o for o in rendered if o["kind"] == "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["pagoda.dev/inference-service"] == NAME


def test_cpu_variants_ask_for_no_gpu():
    p = pod(spec(resources={"gpus": 0, "cpu": "2", "memory": "4Gi"}))
    c = p["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert flag(c["args"], "--device") == "cpu"
    assert "nodeSelector" not in p and "tolerations" not in p


def test_probes_give_model_loading_the_startup_timeout():
    c = container(spec(runtime={"startupTimeoutSeconds": 1200}))
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    # Ready follows the runtime within a second or two of loading, not a probe period later.
    assert startup["periodSeconds"] <= 2
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    live = c["livenessProbe"]
    assert live["httpGet"]["path"] == "/health/live"
    assert live["periodSeconds"] * live["failureThreshold"] >= 60  # conservative
    assert c["readinessProbe"]["periodSeconds"] >= 5  # no more probe load once started
    default = container(spec())["startupProbe"]
    assert default["periodSeconds"] * default["failureThreshold"] == 1800


def test_shutdown_waits_for_endpoint_removal_then_the_drain():
    s = spec(drain={"timeoutSeconds": 90, "endpointRemovalSeconds": 7})
    p = pod(s)
    assert p["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 7}}}
    assert p["terminationGracePeriodSeconds"] > 7 + 90
    assert flag(p["containers"][0]["args"], "--drain-timeout") == "90"
    assert "lifecycle" not in pod(spec(drain={"endpointRemovalSeconds": 0}))["containers"][0]


def test_rollouts_wait_for_no_gpu_by_default_and_follow_the_spec():
    def rolling(**changes):
        return deployment(spec(**changes))["spec"]["strategy"]["rollingUpdate"]

    # GPU pods: the old pod goes first, so a full node pool cannot leave the new one Pending forever.
    assert rolling() == {"maxSurge": 0, "maxUnavailable": 1}
    assert rolling(resources={"gpus": 0}) == {"maxSurge": 1, "maxUnavailable": 0}
    assert rolling(rollout={"maxSurge": "25%", "maxUnavailable": 0}) == {
        "maxSurge": "25%",
        "maxUnavailable": 0,
    }
    # One of them given as 0: the other one must let the rollout move.
    assert rolling(rollout={"maxUnavailable": 0}) == {"maxSurge": 1, "maxUnavailable": 0}
    assert rolling(resources={"gpus": 0}, rollout={"maxSurge": 0}) == {"maxSurge": 0, "maxUnavailable": 1}
    with pytest.raises(ValueError, match="must not both be 0"):
        spec(rollout={"maxSurge": 0, "maxUnavailable": "0%"})
    assert deployment(spec())["spec"]["progressDeadlineSeconds"] > 1800


def test_pods_are_locked_down():
    p = pod(spec(**FULL))
    assert p["securityContext"]["runAsNonRoot"] is True
    assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert p["automountServiceAccountToken"] is False
    for c in p["containers"] + p["initContainers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    c = p["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in p["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert "emptyDir" in volumes[mounts["/cache"]]
    assert c["terminationMessagePath"] == "/dev/termination-log"


def test_hpa_scales_on_queue_depth_fast_up_slow_down():
    s = spec(**FULL, autoscaling={"targetQueueDepth": 6, "scaleDownStabilizationSeconds": 120})
    hpa = objects(s)[("HorizontalPodAutoscaler", child("bf16"))]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": child("bf16")}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 4)
    (metric,) = hpa["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "pagoda_num_requests_waiting"},
            "target": {"type": "AverageValue", "averageValue": "6"},
        },
    }
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 120
    up = max(p["value"] for p in hpa["behavior"]["scaleUp"]["policies"] if p["type"] == "Percent")
    assert up >= 100


def test_replicas_have_their_own_field_manager():
    objs = objects(spec(**FULL))
    assert "replicas" not in objs[("Deployment", child("bf16"))]["spec"]
    assert "replicas" not in objs[("Deployment", child("int4"))]["spec"]
    s = spec(**FULL)
    autoscaled, fixed = (plan_variant(s, v) for v in s.variants)

    def live(replicas, *, main_applied=False):
        fields = {"f:spec": {"f:replicas": {}}} if main_applied else {"f:spec": {"f:template": {}}}
        entry = {"manager": "pagoda-operator", "operation": "Apply", "fieldsV1": fields}
        return {"metadata": {"managedFields": [entry]}, "spec": {"replicas": replicas}}

    assert replicas_to_apply(fixed, None) == 2
    assert replicas_to_apply(fixed, live(5)) == 2
    # Autoscaled: created at min, raised to min, otherwise the HPA's; taken over from an older operator.
    assert replicas_to_apply(autoscaled, None) == 1
    assert replicas_to_apply(autoscaled, live(0)) == 1
    assert replicas_to_apply(autoscaled, live(3)) is None
    assert replicas_to_apply(autoscaled, live(3, main_applied=True)) == 3
    off = spec(**{**FULL, "autoscaling": {"enabled": False}})
    assert replicas_to_apply(plan_variant(off, off.variants[0]), live(3)) == 1
    assert not [k for k in objects(off) if k[0] == "HorizontalPodAutoscaler"]


def test_pdb_lets_node_drains_take_one_pod_at_a_time():
    pdb = objects(spec())[("PodDisruptionBudget", child("bf16"))]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"] == {
        "pagoda.dev/inference-service": NAME,
        "pagoda.dev/variant": "bf16",
    }


def test_service_monitor_only_when_the_crd_exists_and_asked():
    assert ("ServiceMonitor", NAME) not in objects(spec())
    sm = objects(spec(), service_monitor=True)[("ServiceMonitor", NAME)]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert {"key": "pagoda.dev/variant", "operator": "Exists"} in sm["spec"]["selector"]["matchExpressions"]
    assert ("ServiceMonitor", NAME) not in objects(
        spec(monitoring={"serviceMonitor": False}), service_monitor=True
    )


def test_a_variant_that_cannot_fit_gets_no_pods():
    s = spec(
        model={"source": "pvc://m/70b", "family": "llama-3-70b"},
        variants=[{"name": "bf16"}, {"name": "int4", "quantization": "int4"}],
        resources={"gpus": 1, "gpuMemory": "80Gi"},
    )
    names = {name for _, name in objects(s)}
    assert not any(n == child("bf16") for n in names)
    assert {("Deployment", child("int4")), ("Service", NAME)} <= set(objects(s))


def test_render_is_deterministic():
    s = spec(**FULL)
    assert render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions()) == render(
        plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions()
    )


def test_pod_template_is_merged_over_the_rendered_pod():
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    s = spec(
        podTemplate={
            "metadata": {"labels": {"team": "ml", "pagoda.dev/variant": "mine"}, "annotations": {"a": "b"}},
            "spec": {
                "affinity": affinity,
                "runtimeClassName": "nvidia",
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
                ],
                "env": [{"name": "EXTRA", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumes": [{"name": "extra", "emptyDir": {}}],
                "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
            },
        }
    )
    template = deployment(s)["spec"]["template"]
    validate(deployment(s))
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["labels"]["pagoda.dev/variant"] == "bf16"  # the selector's label wins
    assert template["metadata"]["annotations"]["a"] == "b"
    p = template["spec"]
    assert (p["affinity"], p["runtimeClassName"]) == (affinity, "nvidia")
    assert p["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    assert {"name": "extra", "emptyDir": {}} in p["volumes"] and {"name": "cache", "emptyDir": {}} in p[
        "volumes"
    ]
    (container,) = p["containers"]
    assert container["env"][-1]["name"] == "EXTRA" and container["env"][0]["name"] == "HOME"
    assert container["volumeMounts"][-1] == {"name": "extra", "mountPath": "/extra"}
    with pytest.raises(ValueError, match="must not reuse the runtime's volume names"):
        spec(podTemplate={"spec": {"volumes": [{"name": "cache", "emptyDir": {}}]}})


def test_network_policy_only_when_enabled():
    assert not [k for k in objects(spec()) if k[0] == "NetworkPolicy"]
    policy = objects(spec(networkPolicy={"enabled": True}))[("NetworkPolicy", NAME)]
    validate(policy)
    assert policy["spec"]["ingress"][0]["from"][0] == {"podSelector": {"matchLabels": {}}}


def test_runtime_pods_get_no_service_account_token():
    assert pod(spec())["automountServiceAccountToken"] is False
