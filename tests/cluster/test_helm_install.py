"""The Helm chart installed, upgraded and uninstalled on a control plane of its own (the suite's shared
one holds the kustomize install). The operator runs on the host with the installed ServiceAccount's
token, the runtime image and the watched namespaces (operator.watchNamespaces, so it peers through
the chart's KopfPeering CRD) that the installed Deployment gives it, as it would in its pod."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from conftest import ROOT, controlplane, started_control_plane, write_operator_kubeconfig
from kube_objects import apply, get, get_or_none, wait_for
from operator_process import OperatorProcess
from pagoda_operator.names import variant_object_name
from test_operator import inference_service, wait_ready

pytestmark = pytest.mark.cluster

CHART = str(ROOT / "charts" / "pagoda")
NAMESPACE = "pagoda-system"


@pytest.fixture(scope="module")
def own_control_plane() -> Iterator[controlplane.ControlPlane]:
    yield from started_control_plane()


def helm(cp, *args: str) -> str:
    binary = controlplane.ensure_binaries(("helm",))["helm"]
    done = subprocess.run([str(binary), *args], env=cp.env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def operator_container_of_install(cp) -> dict:
    deployment = get(cp, "deployment", "pagoda-operator", "-n", NAMESPACE)
    return deployment["spec"]["template"]["spec"]["containers"][0]


def runtime_image_of_install(cp) -> str:
    env = operator_container_of_install(cp)["env"]
    return next(e["value"] for e in env if e["name"] == "PAGODA_RUNTIME_IMAGE")


def watched_namespaces_of_install(cp) -> tuple[str, ...]:
    """The namespaces of the installed Deployment's --namespace arguments (operator.watchNamespaces)."""
    args = operator_container_of_install(cp)["args"]
    return tuple(a.removeprefix("--namespace=") for a in args if a.startswith("--namespace="))


def start_operator(cp, tmp_path, attempt: int) -> OperatorProcess:
    logs = tmp_path / f"operator-{attempt}"
    logs.mkdir()
    operator = OperatorProcess(
        write_operator_kubeconfig(cp, logs / "kubeconfig"),
        logs,
        resync_seconds=1.0,
        namespaces=watched_namespaces_of_install(cp),
        args=(f"--runtime-image={runtime_image_of_install(cp)}",),
    )
    operator.start()
    return operator


def test_install_upgrade_and_uninstall(own_control_plane, tmp_path):
    cp = own_control_plane
    helm(
        cp,
        "install",
        "pagoda",
        CHART,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--set",
        "runtime.image.tag=0.1.0",
        # Peering in the watched namespace, through the CRD and RBAC the chart installs.
        "--set",
        "operator.watchNamespaces={served}",
    )
    cp.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/inferenceservices.pagoda.dev")
    assert runtime_image_of_install(cp) == "pagoda-runtime:0.1.0"
    assert watched_namespaces_of_install(cp) == ("served",)
    cp.kubectl("create", "namespace", "served")
    operator = start_operator(cp, tmp_path, 1)
    try:
        apply(cp, "served", inference_service(variants=[("bf16", "none")], max_replicas=1))
        wait_ready(cp, operator, "served", "chat")
        assert get_or_none(cp, "kopfpeerings.kopf.dev", "pagoda-operator", "-n", "served") is not None
    finally:
        operator.stop()
    assert not operator.failures(), operator.failures()
    deployment = variant_object_name("chat", "bf16")

    def image() -> str:
        found = get(cp, "deployment", deployment, "-n", "served")
        return found["spec"]["template"]["spec"]["containers"][0]["image"]

    assert image() == "pagoda-runtime:0.1.0"

    helm(
        cp, "upgrade", "pagoda", CHART, "-n", NAMESPACE, "--reuse-values", "--set", "runtime.image.tag=0.2.0"
    )
    assert runtime_image_of_install(cp) == "pagoda-runtime:0.2.0"
    operator = start_operator(cp, tmp_path, 2)
    try:
        wait_for(
            lambda: image() == "pagoda-runtime:0.2.0", timeout=60, what="the runtime to follow the chart"
        )
        wait_ready(cp, operator, "served", "chat")
    finally:
        operator.stop()
    assert not operator.failures(), operator.failures()
    history = json.loads(helm(cp, "history", "pagoda", "-n", NAMESPACE, "-o", "json"))
    assert [h["status"] for h in history] == ["superseded", "deployed"]

    helm(cp, "uninstall", "pagoda", "-n", NAMESPACE, "--wait", "--timeout", "60s")
    assert get_or_none(cp, "deployment", "pagoda-operator", "-n", NAMESPACE) is None
    assert get_or_none(cp, "clusterrole", "pagoda-operator") is None
    # The CRDs stay (helm.sh/resource-policy: keep), and with them every InferenceService: removing
    # the operator does not take the model servers down.
    assert get_or_none(cp, "crd", "inferenceservices.pagoda.dev") is not None
    assert get_or_none(cp, "infsvc", "chat", "-n", "served") is not None
    assert get_or_none(cp, "deployment", deployment, "-n", "served") is not None
