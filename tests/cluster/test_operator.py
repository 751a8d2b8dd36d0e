"""The real operator against the loopback control plane, running with exactly the RBAC in manifests/.

Everything goes through kubectl as a user would: apply YAML, read status and children, edit,
delete. kwok's fake GPU node runs the pods (scheduled, then Ready, without containers).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from kube_objects import (
    ISVC_LABEL,
    apply,
    children,
    condition,
    get,
    get_or_none,
    is_ready,
    pods,
    wait_for,
)
from operator_process import OPERATOR_ACCOUNT, OPERATOR_NAMESPACE
from pagoda_operator.names import variant_object_name

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
QUEUE_METRIC = "pagoda_num_requests_waiting"
RESYNCED = "Resync succeeded"


def inference_service(variants=(("bf16", "none"), ("int4", "int4")), max_replicas=2):
    """ "chat", which the fake GPU node can run: a model baked into the image, one H100 per pod."""
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat"},
        "spec": {
            "model": {"source": "bundled://smollm2-135m", "family": "smollm2-135m", "maxModelLen": 2048},
            "runtime": {"maxNumSeqs": 32},
            "variants": [
                {"name": v, "quantization": q, "replicas": {"min": 1, "max": max_replicas}}
                for v, q in variants
            ],
            "resources": {
                "gpus": 1,
                "gpuProduct": GPU_PRODUCT,
                "gpuMemory": "80Gi",
                "cpu": "2",
                "memory": "8Gi",
            },
            "drain": {"timeoutSeconds": 5, "endpointRemovalSeconds": 1},
        },
    }


def expected_children(name: str, variants) -> set[tuple[str, str]]:
    kinds = ["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
    return {("Service", name)} | {(kind, variant_object_name(name, v)) for v in variants for kind in kinds}


def wait_ready(cp, operator, namespace: str, name: str, timeout: float = 60.0) -> dict:
    """The InferenceService once its status says Ready for its current generation."""
    return wait_for(
        lambda: get(cp, "infsvc", name, "-n", namespace),
        check=lambda isvc: observed(isvc) and condition(isvc, "Ready").get("status") == "True",
        timeout=timeout,
        what=f"{namespace}/{name} Ready",
        details=operator.log_tail,
    )


def observed(isvc: dict) -> bool:
    return isvc.get("status", {}).get("observedGeneration") == isvc["metadata"]["generation"]


def wait_resyncs(operator, namespace: str, name: str, count: int) -> None:
    done = operator.handled(namespace, name, RESYNCED)
    wait_for(
        lambda: operator.handled(namespace, name, RESYNCED) >= done + count,
        what=f"{count} resyncs of {namespace}/{name}",
        details=operator.log_tail,
    )


def writes_snapshot(cp, namespace: str, name: str) -> dict:
    """What changes when anyone writes the object or its children (HPAs: only the operator's writes)."""
    isvc = get(cp, "infsvc", name, "-n", namespace)
    state = {("InferenceService", name): isvc["metadata"]["resourceVersion"]}
    for key, child in children(cp, namespace, name).items():
        meta = child["metadata"]
        by_operator = [m for m in meta.get("managedFields", []) if m["manager"] == "pagoda-operator"]
        # The HPA controller writes its own status on its own schedule; the operator's managedFields
        # entry alone shows whether the operator wrote.
        version = None if key[0] == "HorizontalPodAutoscaler" else meta["resourceVersion"]
        state[key] = (meta["uid"], meta.get("generation"), version, json.dumps(by_operator, sort_keys=True))
    return state


def settled_snapshot(cp, operator, namespace: str, name: str) -> dict:
    """The snapshot once a whole resync passes without any write: rollouts and controllers are done."""

    def hpas_reported() -> bool:
        # The HPA controller reports each HPA on its own 15 s period, and the status follows it.
        found = children(cp, namespace, name)
        hpas = [c for (kind, _), c in found.items() if kind == "HorizontalPodAutoscaler"]
        return all(c.get("status", {}).get("conditions") for c in hpas)

    wait_for(hpas_reported, timeout=45, what="the HPAs to report")

    def unchanged_over_a_resync():
        before = writes_snapshot(cp, namespace, name)
        wait_resyncs(operator, namespace, name, 1)
        return before if writes_snapshot(cp, namespace, name) == before else None

    return wait_for(unchanged_over_a_resync, timeout=45, what=f"{namespace}/{name} to settle", interval=0)


def events(cp, namespace: str, name: str, reason: str) -> list[dict]:
    selector = f"involvedObject.name={name},reason={reason}"
    return get(cp, "events", "-n", namespace, "--field-selector", selector)["items"]


def test_install_from_manifests(control_plane, pagoda_install):
    cp = control_plane
    for applied in (
        "customresourcedefinition.apiextensions.k8s.io/inferenceservices.pagoda.dev",
        "customresourcedefinition.apiextensions.k8s.io/clusterkopfpeerings.kopf.dev",
        "customresourcedefinition.apiextensions.k8s.io/kopfpeerings.kopf.dev",
        f"namespace/{OPERATOR_NAMESPACE}",
        f"serviceaccount/{OPERATOR_ACCOUNT}",
        "clusterrole.rbac.authorization.k8s.io/pagoda-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/pagoda-operator",
        "deployment.apps/pagoda-operator",
    ):
        assert re.search(rf"^{re.escape(applied)} (created|configured|unchanged)$", pagoda_install, re.M), (
            pagoda_install
        )
    crd = get(cp, "crd", "inferenceservices.pagoda.dev")
    for type_ in ("Established", "NamesAccepted"):
        assert condition(crd, type_)["status"] == "True", crd["status"]
    resources = cp.kubectl("api-resources", "--api-group=pagoda.dev").stdout
    row = r"^inferenceservices\s+infsvc\s+pagoda.dev/v1alpha1\s+true\s+InferenceService$"
    assert re.search(row, resources, re.M), resources
    # A pod created means the operator's pod template passes the namespace's restricted Pod Security.
    wait_for(
        lambda: pods(cp, OPERATOR_NAMESPACE, "app.kubernetes.io/name=pagoda-operator"),
        what="the operator Deployment's pod to be admitted",
    )


def test_operator_runs_as_its_service_account_with_least_privilege(control_plane, operator_kubeconfig):
    def as_operator(*args: str) -> str:
        cmd = [str(control_plane.bin["kubectl"]), f"--kubeconfig={operator_kubeconfig}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

    whoami = json.loads(as_operator("auth", "whoami", "-o", "json"))["status"]["userInfo"]
    assert whoami["username"] == f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
    assert as_operator("auth", "can-i", "patch", "deployments.apps", "-A") == "yes"
    assert as_operator("auth", "can-i", "delete", "inferenceservices.pagoda.dev", "-A") == "no"
    # The one Secret a service names for its API key is read by name; none is listed or watched.
    assert as_operator("auth", "can-i", "get", "secrets", "-A") == "yes"
    assert as_operator("auth", "can-i", "list", "secrets", "-A") == "no"
    assert as_operator("auth", "can-i", "watch", "secrets", "-A") == "no"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.stem)
def test_example_is_accepted_and_reconciled(control_plane, pagoda_operator, isvc_namespace, example, request):
    cp = control_plane
    manifests = list(yaml.safe_load_all(example.read_text()))
    names = [manifest["metadata"]["name"] for manifest in manifests]
    if any(m["spec"].get("parallelism", {}).get("nodes", 1) > 1 for m in manifests):
        request.getfixturevalue("lws_controller")
    applied = apply(cp, isvc_namespace, example.read_text())
    assert applied.strip().splitlines() == [f"inferenceservice.pagoda.dev/{name} created" for name in names]
    # A second client-side apply of the same file finds nothing the apiserver filled in to undo.
    assert apply(cp, isvc_namespace, example.read_text()).strip().splitlines() == [
        f"inferenceservice.pagoda.dev/{name} unchanged" for name in names
    ]

    for name in names:
        isvc = wait_for(
            lambda name=name: get(cp, "infsvc", name, "-n", isvc_namespace),
            check=observed,
            what=f"{name} to be reconciled",
            details=pagoda_operator.log_tail,
        )
        ready = condition(isvc, "Ready")
        assert ready["reason"] not in ("InvalidSpec", "ChildRejected"), ready["message"]
        assert ("Service", name) in children(cp, isvc_namespace, name)


def test_children_have_the_expected_fields(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service())
    uid = get(cp, "infsvc", "chat", "-n", ns)["metadata"]["uid"]
    want = expected_children("chat", ["bf16", "int4"])
    found = wait_for(
        lambda: children(cp, ns, "chat"),
        check=lambda current: set(current) == want,
        what="the children",
        details=pagoda_operator.log_tail,
    )

    for (kind, name), child in found.items():
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "InferenceService",
            "chat",
            uid,
            True,
        ), f"{kind}/{name}"

    everything = found[("Service", "chat")]["spec"]
    assert everything["selector"] == {ISVC_LABEL: "chat"}
    assert [(p["port"], p["targetPort"]) for p in everything["ports"]] == [(8000, "http")]
    for variant, quantization in (("bf16", "none"), ("int4", "int4")):
        own = {ISVC_LABEL: "chat", "pagoda.dev/variant": variant}
        name = variant_object_name("chat", variant)
        deployment = found[("Deployment", name)]["spec"]
        assert deployment["selector"]["matchLabels"] == own
        pod = deployment["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        args = container["args"]
        assert args[args.index("--quantization") + 1] == quantization
        assert args[args.index("--max-num-seqs") + 1] == "32"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        (preferred,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred["preference"]["matchExpressions"][0]["values"] == [GPU_PRODUCT]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert found[("Service", name)]["spec"]["selector"] == own

        hpa = found[("HorizontalPodAutoscaler", name)]["spec"]
        assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 2)
        (metric,) = hpa["metrics"]
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] == QUEUE_METRIC
        assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "4"}

        pdb = found[("PodDisruptionBudget", name)]["spec"]
        assert pdb["selector"]["matchLabels"] == own
        assert pdb["maxUnavailable"] == 1


def test_pods_run_on_the_gpu_node_and_the_status_says_ready(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    # Fixed replicas: without a metrics adapter an HPA cannot scale, which the status calls Degraded.
    apply(cp, ns, inference_service(max_replicas=1))
    isvc = wait_ready(cp, pagoda_operator, ns, "chat")

    running = pods(cp, ns, f"{ISVC_LABEL}=chat")
    assert sorted(p["metadata"]["labels"]["pagoda.dev/variant"] for p in running) == ["bf16", "int4"]
    for pod in running:
        assert pod["spec"]["nodeName"] == cp.node_name
        assert is_ready(pod)

    status = isvc["status"]
    assert status["url"] == f"http://chat.{ns}.svc:8000/v1"
    assert status["observedGeneration"] == isvc["metadata"]["generation"] == 1
    assert status["variants"] == [
        {
            "name": variant,
            "replicas": 1,
            "readyReplicas": 1,
            "fits": True,
            "service": variant_object_name("chat", variant),
            "modelNames": ["chat", f"chat:{variant}"],
        }
        for variant in ("bf16", "int4")
    ]
    expected = {
        "Ready": ("True", "Serving"),
        "Progressing": ("False", "Stable"),
        "Degraded": ("False", "Healthy"),
        "ModelFits": ("True", "Fits"),
        # kstatus's (Flux's health checks): nothing under way, nothing blocked.
        "Reconciling": ("False", "Serving"),
        "Stalled": ("False", "Healthy"),
    }
    got = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert got == expected
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in status["conditions"])
    assert status["url"] in condition(isvc, "Ready")["message"]

    table = cp.kubectl("get", "infsvc", "chat", "-n", ns).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "READY",
        "VARIANTS",
        "REPLICAS",
        "FITS",
        "MODEL",
        "URL",
        "CACHE",
        "AGE",
    ]
    row = ["chat", "True", "bf16,int4", "2/2", "True", "bundled://smollm2-135m", status["url"]]
    assert table[1].split()[:7] == row


def test_spec_edit_rolls_out(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service(variants=[("bf16", "none")], max_replicas=1))
    wait_ready(cp, pagoda_operator, ns, "chat")
    deployment_name = variant_object_name("chat", "bf16")
    generation = get(cp, "deployment", deployment_name, "-n", ns)["metadata"]["generation"]

    edit = '{"spec":{"runtime":{"maxNumSeqs":64}}}'
    cp.kubectl("patch", "infsvc", "chat", "-n", ns, "--type=merge", "-p", edit)

    def max_num_seqs(pod_spec: dict) -> str:
        args = pod_spec["containers"][0]["args"]
        return args[args.index("--max-num-seqs") + 1]

    deployment = wait_for(
        lambda: get(cp, "deployment", deployment_name, "-n", ns),
        check=lambda d: max_num_seqs(d["spec"]["template"]["spec"]) == "64",
        what="the Deployment's args to change",
        details=pagoda_operator.log_tail,
    )
    assert deployment["metadata"]["generation"] > generation
    # GPU pods roll with maxSurge 0, maxUnavailable 1: the old pod goes, then the new one comes up.
    wait_for(
        lambda: pods(cp, ns, f"{ISVC_LABEL}=chat"),
        check=lambda ps: [max_num_seqs(p["spec"]) for p in ps] == ["64"] and all(map(is_ready, ps)),
        what="the rollout to replace the pod",
    )
    isvc = wait_for(
        lambda: get(cp, "infsvc", "chat", "-n", ns),
        check=lambda i: observed(i) and condition(i, "Progressing")["status"] == "False",
        what="Progressing=False after the rollout",
        details=pagoda_operator.log_tail,
    )
    assert isvc["metadata"]["generation"] == 2
    assert condition(isvc, "Ready")["status"] == "True"


def test_removing_a_variant_deletes_its_children(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service())
    wait_ready(cp, pagoda_operator, ns, "chat")
    uids = {key: c["metadata"]["uid"] for key, c in children(cp, ns, "chat").items()}
    want = expected_children("chat", ["bf16"])

    edit = '[{"op":"remove","path":"/spec/variants/1"}]'
    cp.kubectl("patch", "infsvc", "chat", "-n", ns, "--type=json", "-p", edit)

    left = wait_for(
        lambda: children(cp, ns, "chat"),
        check=lambda current: set(current) == want,
        what="the int4 children to be deleted",
        details=pagoda_operator.log_tail,
    )
    assert {key: c["metadata"]["uid"] for key, c in left.items()} == {key: uids[key] for key in want}
    wait_for(lambda: not pods(cp, ns, "pagoda.dev/variant=int4"), what="the int4 pods to go")
    isvc = wait_ready(cp, pagoda_operator, ns, "chat")
    assert [v["name"] for v in isvc["status"]["variants"]] == ["bf16"]
    assert isvc["status"]["variantNames"] == "bf16"


def test_deleting_the_inference_service_garbage_collects_its_children(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service())
    wait_ready(cp, pagoda_operator, ns, "chat")

    cp.kubectl("delete", "infsvc", "chat", "-n", ns, "--timeout=30s")

    wait_for(lambda: not children(cp, ns, "chat"), what="the children to be garbage-collected")
    wait_for(lambda: not pods(cp, ns, f"{ISVC_LABEL}=chat"), what="the pods to go")
    wait_for(lambda: get(cp, "replicasets", "-n", ns)["items"] == [], what="the ReplicaSets to go")


def test_deleted_child_is_recreated(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service(variants=[("bf16", "none")]))
    wait_ready(cp, pagoda_operator, ns, "chat")
    service = variant_object_name("chat", "bf16")
    uid = get(cp, "service", service, "-n", ns)["metadata"]["uid"]

    cp.kubectl("delete", "service", service, "-n", ns)

    wait_for(
        lambda: get_or_none(cp, "service", service, "-n", ns),
        check=lambda service: service and service["metadata"]["uid"] != uid,
        what="the resync to recreate the Service",
        details=pagoda_operator.log_tail,
    )


def test_child_the_api_refuses_is_reported_and_retried(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services"},
        "spec": {"hard": {"services": "0"}},
    }
    apply(cp, ns, quota)
    wait_for(
        lambda: get(cp, "resourcequota", "no-services", "-n", ns).get("status", {}).get("hard"),
        what="the quota to be counted",
    )
    apply(cp, ns, inference_service(variants=[("bf16", "none")]))

    isvc = wait_for(
        lambda: get(cp, "infsvc", "chat", "-n", ns),
        check=lambda i: condition(i, "Ready").get("reason") == "ChildRejected",
        what="Ready=False ChildRejected",
        details=pagoda_operator.log_tail,
    )
    ready = condition(isvc, "Ready")
    assert ready["status"] == "False"
    assert 'services "chat" is forbidden: exceeded quota: no-services' in ready["message"], ready["message"]
    warned = wait_for(lambda: events(cp, ns, "chat", "ChildRejected"), what="the ChildRejected event")
    assert warned[0]["type"] == "Warning"

    cp.kubectl("delete", "resourcequota", "no-services", "-n", ns)

    wait_ready(cp, pagoda_operator, ns, "chat")
    assert set(children(cp, ns, "chat")) == expected_children("chat", ["bf16"])


def test_reapplying_the_same_yaml_writes_nothing(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    manifest = inference_service()
    apply(cp, ns, manifest)
    wait_ready(cp, pagoda_operator, ns, "chat")
    before = settled_snapshot(cp, pagoda_operator, ns, "chat")

    # The apiserver fills no defaults inside the variants list, so kubectl finds nothing to send.
    assert apply(cp, ns, manifest).strip() == "inferenceservice.pagoda.dev/chat unchanged"
    wait_resyncs(pagoda_operator, ns, "chat", 2)

    after = writes_snapshot(cp, ns, "chat")
    assert after == before


def test_operator_restart_creates_no_duplicates_and_changes_nothing(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service())
    wait_ready(cp, pagoda_operator, ns, "chat")
    before = settled_snapshot(cp, pagoda_operator, ns, "chat")

    pagoda_operator.restart()

    wait_for(
        lambda: pagoda_operator.handled(ns, "chat", "Handler 'on_spec' succeeded"),
        what="the restarted operator to resume chat",
        details=pagoda_operator.log_tail,
    )
    wait_resyncs(pagoda_operator, ns, "chat", 1)
    assert set(children(cp, ns, "chat")) == expected_children("chat", ["bf16", "int4"])
    assert writes_snapshot(cp, ns, "chat") == before
    assert len(pods(cp, ns, f"{ISVC_LABEL}=chat")) == 2


INVALID = {
    "min-above-max": (
        lambda s: s["variants"][0].update(replicas={"min": 3, "max": 1}),
        "replicas.min must not exceed replicas.max",
    ),
    "duplicate-variant-names": (
        lambda s: s["variants"][1].update(name="bf16"),
        "variant names must be unique",
    ),
    "unknown-quantization": (
        lambda s: s["variants"][0].update(quantization="int3"),
        'spec.variants[0].quantization: Unsupported value: "int3"',
    ),
    "gguf-variant-of-a-folder": (
        lambda s: (
            s["model"].update(source="file:///models/llama"),
            s["variants"][0].update(quantization="gguf"),
        ),
        "quantization gguf needs a GGUF model source",
    ),
    "tensor-size-other-than-gpus-times-nodes": (
        lambda s: s.update(parallelism={"tensor": 2, "nodes": 3}),
        "parallelism.tensor must equal resources.gpus x parallelism.nodes",
    ),
    "read-write-once-cache-across-nodes": (
        lambda s: (
            s["model"].update(source="hf://org/m", revision="a" * 40, cache={"accessMode": "ReadWriteOnce"}),
            s.update(parallelism={"nodes": 3}),
        ),
        "parallelism.nodes above 1 needs model.cache.accessMode ReadWriteMany",
    ),
    "draft-model-without-its-source": (
        lambda s: s["variants"][0].update(speculative={"method": "draft_model", "numSpeculativeTokens": 4}),
        "speculative.method draft_model needs speculative.model",
    ),
    "eagle-head-without-its-source": (
        lambda s: s["variants"][0].update(speculative={"method": "eagle3", "numSpeculativeTokens": 3}),
        "speculative.method eagle and eagle3 need speculative.model",
    ),
    "too-many-speculative-tokens": (
        lambda s: s["variants"][0].update(speculative={"method": "ngram", "numSpeculativeTokens": 17}),
        "spec.variants[0].speculative.numSpeculativeTokens: Invalid value: 17",
    ),
    "duplicate-adapter-names": (
        lambda s: s.update(
            adapters=[{"name": "sql", "source": "pvc://a/x"}, {"name": "sql", "source": "pvc://a/y"}]
        ),
        "adapter names must be unique",
    ),
    "adapter-rank-above-the-limit": (
        lambda s: (
            s.update(adapters=[{"name": "sql", "source": "pvc://a/x", "rank": 64}]),
            s.setdefault("runtime", {}).update(maxLoraRank=16),
        ),
        "an adapter's rank is above runtime.maxLoraRank",
    ),
    "bad-model-source-scheme": (
        lambda s: s["model"].update(source="gs://bucket/llama"),
        'spec.model.source: Invalid value: "gs://bucket/llama"',
    ),
}


@pytest.mark.parametrize("case", INVALID, ids=str)
def test_invalid_spec_is_rejected_by_the_apiserver(control_plane, isvc_namespace, case):
    cp, ns = control_plane, isvc_namespace
    manifest = inference_service()
    break_it, message = INVALID[case]
    break_it(manifest["spec"])

    result = cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest), check=False)

    assert result.returncode != 0
    assert 'The InferenceService "chat" is invalid' in result.stderr
    assert message in result.stderr
    assert get_or_none(cp, "infsvc", "chat", "-n", ns) is None


def test_variant_that_does_not_fit_gets_no_pods_and_is_reported(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, (ROOT / "manifests" / "examples" / "does-not-fit.yaml").read_text())

    isvc = wait_for(
        lambda: get(cp, "infsvc", "llama3-70b", "-n", ns),
        check=lambda i: condition(i, "ModelFits"),
        what="the ModelFits condition",
        details=pagoda_operator.log_tail,
    )
    fits = condition(isvc, "ModelFits")
    assert (fits["status"], fits["reason"]) == ("False", "InsufficientMemory")
    numbers = (
        r"variant bf16 \(none\) needs [\d.]+ GiB \(weights [\d.]+ GiB.*\), which does not fit in 80\.0 GiB"
    )
    assert re.search(numbers, fits["message"]), fits["message"]
    assert [(v["name"], v["fits"]) for v in isvc["status"]["variants"]] == [("bf16", False), ("int4", True)]

    warned = wait_for(
        lambda: events(cp, ns, "llama3-70b", "ModelDoesNotFit"), what="the ModelDoesNotFit event"
    )
    assert warned[0]["type"] == "Warning"
    assert warned[0]["message"] == fits["message"]
    wait_resyncs(pagoda_operator, ns, "llama3-70b", 2)
    assert len(events(cp, ns, "llama3-70b", "ModelDoesNotFit")) == 1, "the warning must not repeat"

    deployments = {name for kind, name in children(cp, ns, "llama3-70b") if kind == "Deployment"}
    assert deployments == {variant_object_name("llama3-70b", "int4")}
    assert pods(cp, ns, "pagoda.dev/variant=bf16") == []
    assert len(pods(cp, ns, "pagoda.dev/variant=int4")) == 1
