"""Edits never cut serving capacity, names never collide, status tells the truth: the real operator on
the loopback control plane, driven through kubectl as a user would, under its own RBAC."""

from __future__ import annotations

import subprocess
import threading

import pytest
import yaml
from kube_objects import ISVC_LABEL, apply, children, condition, get, get_or_none, is_ready, pods, wait_for
from pagoda_operator.names import variant_object_name
from test_operator import events, inference_service, observed, wait_ready, wait_resyncs

pytestmark = pytest.mark.cluster


def patch(cp, namespace: str, name: str, merge: dict) -> None:
    cp.kubectl("patch", "infsvc", name, "-n", namespace, "--type=merge", "-p", yaml.safe_dump(merge))


def wait_condition(cp, operator, namespace, name, type_, status, reason=None, timeout=45.0) -> dict:
    def matches(isvc):
        cond = condition(isvc, type_)
        return observed(isvc) and cond.get("status") == status and reason in (None, cond.get("reason"))

    return wait_for(
        lambda: get(cp, "infsvc", name, "-n", namespace),
        check=matches,
        timeout=timeout,
        what=f"{name} {type_}={status} {reason or ''}",
        details=operator.log_tail,
    )


def owner_uid(obj: dict) -> str | None:
    refs = obj["metadata"].get("ownerReferences", [])
    return refs[0]["uid"] if refs else None


# --- names -----------------------------------------------------------------------------------------


def test_a_variant_and_a_service_with_the_same_joined_name_do_not_collide(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    chat = inference_service(variants=[("fp8", "fp8")], max_replicas=1)
    chat_fp8 = inference_service(variants=[("bf16", "none")], max_replicas=1)
    chat_fp8["metadata"]["name"] = "chat-fp8"
    apply(cp, ns, chat)
    apply(cp, ns, chat_fp8)
    wait_ready(cp, pagoda_operator, ns, "chat")
    wait_ready(cp, pagoda_operator, ns, "chat-fp8")
    uids = {name: get(cp, "infsvc", name, "-n", ns)["metadata"]["uid"] for name in ("chat", "chat-fp8")}
    before = get(cp, "service", "chat-fp8", "-n", ns)

    wait_resyncs(pagoda_operator, ns, "chat", 2)
    wait_resyncs(pagoda_operator, ns, "chat-fp8", 2)

    # The URL http://chat-fp8... belongs to InferenceService chat-fp8, and nobody rewrites it.
    service = get(cp, "service", "chat-fp8", "-n", ns)
    assert owner_uid(service) == uids["chat-fp8"]
    assert service["spec"]["selector"] == {ISVC_LABEL: "chat-fp8"}
    assert service["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert ("Deployment", variant_object_name("chat", "fp8")) in children(cp, ns, "chat")


def test_a_name_too_long_for_its_children_is_refused_with_the_limit(control_plane, isvc_namespace):
    manifest = inference_service()
    manifest["metadata"]["name"] = "a" * 64

    result = control_plane.kubectl(
        "apply", "-n", isvc_namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )

    assert result.returncode != 0
    assert "metadata.name must be at most 63 characters" in result.stderr, result.stderr


def test_an_object_of_someone_else_is_never_adopted(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    cp.kubectl("create", "service", "clusterip", "chat", "--tcp=80:8080", "-n", ns)
    theirs = get(cp, "service", "chat", "-n", ns)
    apply(cp, ns, inference_service(variants=[("bf16", "none")], max_replicas=1))

    isvc = wait_condition(cp, pagoda_operator, ns, "chat", "Degraded", "True", "NameClash")
    assert (
        f"Service {ns}/chat exists and does not belong to this InferenceService"
        in condition(isvc, "Degraded")["message"]
    )
    assert condition(isvc, "Ready")["status"] == "False"
    warned = wait_for(lambda: events(cp, ns, "chat", "NameClash"), what="the NameClash event")
    assert warned[0]["type"] == "Warning"
    wait_resyncs(pagoda_operator, ns, "chat", 2)
    now = get(cp, "service", "chat", "-n", ns)
    assert now["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert "ownerReferences" not in now["metadata"]

    cp.kubectl("delete", "infsvc", "chat", "-n", ns, "--timeout=30s")
    wait_for(lambda: not pods(cp, ns, f"{ISVC_LABEL}=chat"), what="the InferenceService's pods to go")
    assert get(cp, "service", "chat", "-n", ns)["metadata"]["uid"] == theirs["metadata"]["uid"]


# --- replicas --------------------------------------------------------------------------------------


class ReplicaWatch:
    """Every spec.replicas the apiserver reports for a Deployment, from a kubectl watch."""

    def __init__(self, cp, namespace: str, name: str):
        command = [str(cp.bin["kubectl"]), f"--kubeconfig={cp.kubeconfig}", "get", "deployment", name]
        command += ["-n", namespace, "--watch", "-o", "jsonpath={.spec.replicas}{'\\n'}"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=cp.env)
        self.seen: list[int] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.strip():
                self.seen.append(int(line))

    def stop(self) -> list[int]:
        self.process.terminate()
        self.process.wait(10)
        self.thread.join(10)
        return self.seen


def test_replicas_never_drop_below_min_between_fixed_and_autoscaled(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    manifest = inference_service(variants=[("bf16", "none")])
    manifest["spec"]["variants"][0]["replicas"] = {"min": 3, "max": 3}
    apply(cp, ns, manifest)
    wait_ready(cp, pagoda_operator, ns, "chat")
    deployment = variant_object_name("chat", "bf16")
    watch = ReplicaWatch(cp, ns, deployment)

    def has_hpa() -> bool:
        return ("HorizontalPodAutoscaler", deployment) in children(cp, ns, "chat")

    def transition(spec_edit: dict, hpa: bool) -> None:
        patch(cp, ns, "chat", {"spec": spec_edit})
        wait_for(lambda: has_hpa() == hpa, what=f"the HPA to be {'there' if hpa else 'gone'}")
        wait_resyncs(pagoda_operator, ns, "chat", 2)

    try:
        transition({"variants": [{"name": "bf16", "replicas": {"min": 3, "max": 6}}]}, hpa=True)
        transition({"autoscaling": {"enabled": False}}, hpa=False)
        transition({"autoscaling": {"enabled": True}}, hpa=True)
        transition({"variants": [{"name": "bf16", "replicas": {"min": 3, "max": 3}}]}, hpa=False)
    finally:
        seen = watch.stop()
    assert seen and min(seen) >= 3, seen
    assert len(pods(cp, ns, f"{ISVC_LABEL}=chat")) == 3


# --- fit, make before break, rollouts ----------------------------------------------------------------


def test_a_variant_that_no_longer_fits_keeps_serving_and_is_reported(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service(variants=[("bf16", "none")], max_replicas=1))
    wait_ready(cp, pagoda_operator, ns, "chat")
    deployment = get(cp, "deployment", variant_object_name("chat", "bf16"), "-n", ns)
    running = {p["metadata"]["uid"] for p in pods(cp, ns, f"{ISVC_LABEL}=chat")}

    patch(cp, ns, "chat", {"spec": {"resources": {"gpuMemory": "1Gi"}}})

    isvc = wait_condition(cp, pagoda_operator, ns, "chat", "ModelFits", "False", "InsufficientMemory")
    warned = wait_for(lambda: events(cp, ns, "chat", "ModelDoesNotFit"), what="the ModelDoesNotFit event")
    assert warned[0]["type"] == "Warning"
    row = cp.kubectl("get", "infsvc", "chat", "-n", ns).stdout.splitlines()
    assert row[0].split()[4] == "FITS" and row[1].split()[4] == "False", row
    wait_resyncs(pagoda_operator, ns, "chat", 2)
    still = get(cp, "deployment", variant_object_name("chat", "bf16"), "-n", ns)
    assert still["metadata"]["uid"] == deployment["metadata"]["uid"]
    assert {p["metadata"]["uid"] for p in pods(cp, ns, f"{ISVC_LABEL}=chat")} == running
    assert condition(get(cp, "infsvc", "chat", "-n", ns), "Ready")["status"] == "True"
    assert isvc["status"]["variants"][0]["fits"] is False


def test_a_renamed_variant_serves_until_its_replacement_is_ready(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service(variants=[("bf16", "none")], max_replicas=1))
    wait_ready(cp, pagoda_operator, ns, "chat")
    old = variant_object_name("chat", "bf16")

    # The new variant's pods cannot schedule: no node has this GPU.
    renamed = {
        "variants": [{"name": "bf16-v2", "quantization": "none"}],
        "resources": {"gpuProduct": "B200", "gpuProductRequired": True},
    }
    patch(cp, ns, "chat", {"spec": renamed})

    isvc = wait_condition(cp, pagoda_operator, ns, "chat", "Progressing", "True", "ReplacingVariants")
    assert isvc["status"]["retiring"]["deployments"] == [old]
    wait_resyncs(pagoda_operator, ns, "chat", 2)
    serving = pods(cp, ns, "pagoda.dev/variant=bf16")
    assert len(serving) == 1 and is_ready(serving[0])
    assert get_or_none(cp, "deployment", old, "-n", ns) is not None

    patch(cp, ns, "chat", {"spec": {"resources": {"gpuProduct": None}}})

    wait_for(lambda: get_or_none(cp, "deployment", old, "-n", ns) is None, what="the old Deployment to go")
    # The operator deletes the old Deployment before it writes the status that drops it, and the
    # service stayed Ready throughout, so Ready alone does not say the status has caught up.
    isvc = wait_for(
        lambda: wait_ready(cp, pagoda_operator, ns, "chat"),
        check=lambda isvc: "retiring" not in isvc["status"],
        what="the status to stop listing the retired Deployment",
        details=pagoda_operator.log_tail,
    )
    assert "retiring" not in isvc["status"]
    assert all(is_ready(p) for p in pods(cp, ns, "pagoda.dev/variant=bf16-v2"))


def test_a_replacement_that_never_gets_ready_ends_the_wait_after_the_timeout(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    manifest = inference_service(variants=[("bf16", "none")], max_replicas=1)
    manifest["spec"]["rollout"] = {"replacementTimeoutSeconds": 4}
    apply(cp, ns, manifest)
    wait_ready(cp, pagoda_operator, ns, "chat")
    old = variant_object_name("chat", "bf16")

    patch(
        cp,
        ns,
        "chat",
        {
            "spec": {
                "variants": [{"name": "int4", "quantization": "int4"}],
                "resources": {"gpuProduct": "B200", "gpuProductRequired": True},
            }
        },
    )

    wait_for(lambda: get_or_none(cp, "deployment", old, "-n", ns) is None, what="the bounded wait to end")
    warned = wait_for(lambda: events(cp, ns, "chat", "ReplacementNotReady"), what="the event")
    assert warned[0]["type"] == "Warning" and old in warned[0]["message"]


def test_a_rollout_on_a_full_gpu_node_completes(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    used = sum(
        int(c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu", 0))
        for p in get(cp, "pods", "-A")["items"]
        if p["spec"].get("nodeName") == cp.node_name
        and p["status"].get("phase") not in ("Succeeded", "Failed")
        for c in p["spec"]["containers"]
    )
    free = cp.gpus - used
    assert free >= 1, "another test left pods holding every GPU"
    manifest = inference_service(variants=[("bf16", "none")])
    manifest["spec"]["variants"][0]["replicas"] = {"min": free, "max": free}
    apply(cp, ns, manifest)
    wait_ready(cp, pagoda_operator, ns, "chat", timeout=90)

    patch(cp, ns, "chat", {"spec": {"runtime": {"maxNumSeqs": 64}}})

    def rolled(ps):
        args = [p["spec"]["containers"][0]["args"] for p in ps]
        new = [a for a in args if a[a.index("--max-num-seqs") + 1] == "64"]
        return len(ps) == len(new) == free and all(map(is_ready, ps))

    wait_for(lambda: pods(cp, ns, f"{ISVC_LABEL}=chat"), check=rolled, timeout=90, what="the rollout")


# --- deletion without the operator ---------------------------------------------------------------------


def test_deletion_works_while_the_operator_is_stopped(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    apply(cp, ns, inference_service(variants=[("bf16", "none")], max_replicas=1))
    wait_ready(cp, pagoda_operator, ns, "chat")
    wait_resyncs(pagoda_operator, ns, "chat", 1)
    other = f"{ns}-gone"
    cp.kubectl("create", "namespace", other)
    apply(cp, other, inference_service(variants=[("bf16", "none")], max_replicas=1))
    wait_ready(cp, pagoda_operator, other, "chat")
    assert not get(cp, "infsvc", "chat", "-n", ns)["metadata"].get("finalizers")

    pagoda_operator.stop()
    try:
        cp.kubectl("delete", "infsvc", "chat", "-n", ns, "--timeout=20s")
        wait_for(lambda: not children(cp, ns, "chat"), what="the children to be garbage-collected")
        cp.kubectl("delete", "namespace", other, "--timeout=90s", timeout=120)
    finally:
        pagoda_operator.start()


# --- status reads the children's failures ------------------------------------------------------------


def _no_pods_quota(cp, namespace: str, _spec) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"}}
    apply(cp, namespace, {**quota, "spec": {"hard": {"pods": "0"}}})
    wait_for(
        lambda: get(cp, "resourcequota", "no-pods", "-n", namespace).get("status", {}).get("hard"),
        what="the quota to be counted",
    )


FAILURES = {
    "quota-blocks-pods": (
        _no_pods_quota,
        "FailedCreate",
        "exceeded quota: no-pods",
    ),
    "missing-priority-class": (
        lambda cp, ns, spec: spec["scheduling"].update(priorityClassName="inference-high"),
        "FailedCreate",
        "no PriorityClass with name inference-high was found",
    ),
    "unschedulable": (
        lambda cp, ns, spec: spec["resources"].update(gpuProduct="B200", gpuProductRequired=True),
        "Unschedulable",
        "didn't match Pod's node affinity/selector",
    ),
    "hpa-without-metrics": (
        lambda cp, ns, spec: None,
        "FailedGetPodsMetric",
        "HorizontalPodAutoscaler",
    ),
}


@pytest.mark.parametrize("case", FAILURES, ids=str)
def test_a_childs_failure_is_degraded_with_its_reason_and_an_event(
    control_plane, pagoda_operator, isvc_namespace, case
):
    cp, ns = control_plane, isvc_namespace
    cause, reason, words = FAILURES[case]
    manifest = inference_service(variants=[("bf16", "none")], max_replicas=2 if case.startswith("hpa") else 1)
    manifest["spec"]["scheduling"] = {}
    cause(cp, ns, manifest["spec"])
    apply(cp, ns, manifest)

    isvc = wait_condition(cp, pagoda_operator, ns, "chat", "Degraded", "True", reason, timeout=60)
    assert words in condition(isvc, "Degraded")["message"], condition(isvc, "Degraded")
    warned = wait_for(lambda: events(cp, ns, "chat", reason), what=f"the {reason} event")
    assert warned[0]["type"] == "Warning" and words in warned[0]["message"]
    assert "Events:" in (described := cp.kubectl("describe", "infsvc", "chat", "-n", ns).stdout)
    assert reason in described


# --- the spec's shape and the pods' surroundings -----------------------------------------------------


def test_two_field_managers_own_different_variants(control_plane, pagoda_operator, isvc_namespace):
    cp, ns = control_plane, isvc_namespace
    for manager, variant in (("team-a", "bf16"), ("team-b", "int4")):
        manifest = inference_service(variants=[(variant, variant if variant == "int4" else "none")])
        text = yaml.safe_dump(manifest)
        cp.kubectl("apply", "--server-side", f"--field-manager={manager}", "-n", ns, "-f", "-", input=text)

    isvc = get(cp, "infsvc", "chat", "-n", ns)
    assert [v["name"] for v in isvc["spec"]["variants"]] == ["bf16", "int4"]
    wait_for(
        lambda: children(cp, ns, "chat"),
        check=lambda found: (
            {("Deployment", variant_object_name("chat", v)) for v in ("bf16", "int4")} <= set(found)
        ),
        what="a Deployment per variant",
        details=pagoda_operator.log_tail,
    )


def test_network_policy_admits_clients_and_prometheus_and_goes_when_disabled(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    manifest = inference_service(variants=[("bf16", "none")], max_replicas=1)
    manifest["spec"]["networkPolicy"] = {"enabled": True, "clientPodLabels": {"app": "frontend"}}
    apply(cp, ns, manifest)

    policy = wait_for(
        lambda: get_or_none(cp, "networkpolicy", "chat", "-n", ns),
        what="the NetworkPolicy",
        details=pagoda_operator.log_tail,
    )
    assert policy["spec"]["podSelector"] == {"matchLabels": {ISVC_LABEL: "chat"}}
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app": "frontend"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]

    patch(cp, ns, "chat", {"spec": {"networkPolicy": {"enabled": False}}})

    wait_for(lambda: get_or_none(cp, "networkpolicy", "chat", "-n", ns) is None, what="the policy to go")


def test_pod_template_reaches_the_pods_and_the_apiserver_judges_it(
    control_plane, pagoda_operator, isvc_namespace
):
    cp, ns = control_plane, isvc_namespace
    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
    manifest = inference_service(variants=[("bf16", "none")], max_replicas=1)
    manifest["spec"]["podTemplate"] = {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "topologySpreadConstraints": [spread],
            "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        },
    }
    apply(cp, ns, manifest)
    wait_ready(cp, pagoda_operator, ns, "chat")
    (pod,) = pods(cp, ns, "team=ml")
    assert pod["spec"]["topologySpreadConstraints"] == [spread]
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}} in pod["spec"]["volumes"]
    assert pod["spec"]["containers"][0]["env"][-1]["name"] == "POD"

    patch(
        cp,
        ns,
        "chat",
        {"spec": {"podTemplate": {"spec": {"topologySpreadConstraints": [{**spread, "maxSkew": 0}]}}}},
    )

    isvc = wait_condition(cp, pagoda_operator, ns, "chat", "Ready", "False", "ChildRejected")
    assert "maxSkew" in condition(isvc, "Ready")["message"], condition(isvc, "Ready")
