"""charts/pagoda renders what `kubectl apply -k manifests/` applies, its values set what README says
they set, and `helm lint` passes. Helm and kubectl are the pinned binaries of the tools cache."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from pagoda_operator.names import OPERATOR_POD_LABELS

from tests.repo_modules import ROOT, controlplane

CHART = ROOT / "charts" / "pagoda"
NAMESPACE = "pagoda-system"
KUBE_VERSION = "1.36.3"
# What Helm adds to keep an object on uninstall; kubectl has no such notion.
KEEP = "helm.sh/resource-policy"
# kopf's peering CRDs: the cluster-wide operator's and the one of an operator watching namespaces.
KOPF_PEERING_CRDS = ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")


def _tool(name: str) -> str:
    path = controlplane.binary_path(name)
    if not path.exists():
        if shutil.which("go") is None:
            pytest.skip(f"{name} is not built and Go is not on PATH (run e2e/controlplane/build.sh {name})")
        controlplane.ensure_binaries((name,))
    return str(path)


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def helm_template(*sets: str) -> list[dict]:
    args = [_tool("helm"), "template", "pagoda", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION]
    for value in sets:
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(_run(*args)) if d]


def kustomize(folder: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(_run(_tool("kubectl"), "kustomize", str(folder))) if d]


def by_identity(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def without_keep(obj: dict) -> dict:
    annotations = {k: v for k, v in obj["metadata"].get("annotations", {}).items() if k != KEEP}
    metadata = {k: v for k, v in obj["metadata"].items() if k != "annotations"}
    return {**obj, "metadata": {**metadata, **({"annotations": annotations} if annotations else {})}}


def operator_container(objects: list[dict]) -> dict:
    deployment = by_identity(objects)[("Deployment", "pagoda-operator")]
    return deployment["spec"]["template"]["spec"]["containers"][0]


# The chart's copies of the files it shares with manifests/ (a packaged chart cannot reach outside
# itself, and symbolic links make Helm warn on every command).
COPIES = {
    "inferenceservices.pagoda.dev.yaml": ROOT / "crds" / "inferenceservices.pagoda.dev.yaml",
    "kopf-peering-crd.yaml": ROOT / "manifests" / "kopf-peering-crd.yaml",
    "rbac.yaml": ROOT / "manifests" / "rbac.yaml",
    "prometheus-adapter-rules.yaml": ROOT / "manifests" / "monitoring" / "prometheus-adapter-rules.yaml",
    "grafana-dashboard.json": ROOT / "manifests" / "monitoring" / "grafana-dashboard.json",
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_the_charts_files_are_copies_of_the_manifests(name):
    source = COPIES[name]
    assert (CHART / "files" / name).read_bytes() == source.read_bytes(), (
        f"copy it: cp {source.relative_to(ROOT)} {(CHART / 'files' / name).relative_to(ROOT)}"
    )
    assert set(COPIES) == {p.name for p in (CHART / "files").iterdir()}


def test_the_chart_renders_the_objects_of_the_kustomization():
    chart = by_identity(helm_template())
    kustomized = by_identity(kustomize(ROOT / "manifests"))
    # Helm installs into a namespace it is given (--create-namespace); kustomize creates it.
    kustomized.pop(("Namespace", NAMESPACE))
    assert set(chart) == set(kustomized)
    for identity, obj in kustomized.items():
        assert without_keep(chart[identity]) == obj, identity
    crd = chart[("CustomResourceDefinition", "inferenceservices.pagoda.dev")]
    assert crd["metadata"]["annotations"][KEEP] == "keep"  # uninstalling must not delete every model server
    # Both of kopf's peering kinds: watchNamespaces makes the operator peer in each watched namespace.
    assert {("CustomResourceDefinition", name) for name in KOPF_PEERING_CRDS} <= set(chart)


def test_images_set_once_in_either_install_are_the_same(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(ROOT / "manifests", overlay)],
                "images": [
                    {
                        "name": "pagoda-operator",
                        "newName": "registry.example/pagoda-operator",
                        "newTag": "0.2.0",
                    },
                    {
                        "name": "pagoda-runtime",
                        "newName": "registry.example/pagoda-runtime",
                        "newTag": "0.2.0",
                    },
                ],
            }
        )
    )
    chart = helm_template(
        "operator.image.repository=registry.example/pagoda-operator",
        "operator.image.tag=0.2.0",
        "runtime.image.repository=registry.example/pagoda-runtime",
        "runtime.image.tag=0.2.0",
    )
    for container in (operator_container(chart), operator_container(kustomize(overlay))):
        assert container["image"] == "registry.example/pagoda-operator:0.2.0"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PAGODA_RUNTIME_IMAGE"] == "registry.example/pagoda-runtime:0.2.0"


def test_values_become_operator_flags():
    container = operator_container(
        helm_template(
            "serviceMonitor.labels.release=kube-prometheus-stack",
            "operator.watchNamespaces={team-a,team-b}",
            "operator.resyncSeconds=60",
            "keda.prometheusUrl=http://prometheus.monitoring.svc:9090",
            'keda.gatewayRequestCounter=gateway_requests_total{route=\\"{route}\\"}',
        )
    )
    args = container["args"]
    assert "--service-monitor-label=release=kube-prometheus-stack" in args
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args
    assert "--resync-seconds=60" in args
    assert "--prometheus-url=http://prometheus.monitoring.svc:9090" in args
    assert '--gateway-request-counter=gateway_requests_total{route="{route}"}' in args


@pytest.mark.parametrize("install", ["helm", "kustomize"])
def test_the_operator_pods_are_those_a_service_network_policy_admits(install):
    """A NetworkPolicy of a service with adapters admits OPERATOR_POD_LABELS in $POD_NAMESPACE."""
    objects = helm_template() if install == "helm" else kustomize(ROOT / "manifests")
    deployment = by_identity(objects)[("Deployment", "pagoda-operator")]
    assert OPERATOR_POD_LABELS.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (namespace,) = [e for e in operator_container(objects)["env"] if e["name"] == "POD_NAMESPACE"]
    assert namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_crds_can_be_left_out_or_deleted_with_the_release():
    plain = by_identity(helm_template("crds.keep=false"))
    assert KEEP not in plain[("CustomResourceDefinition", "inferenceservices.pagoda.dev")]["metadata"].get(
        "annotations", {}
    )
    argo = by_identity(helm_template("crds.annotations.argocd\\.argoproj\\.io/sync-options=Prune=false"))
    for name in ("inferenceservices.pagoda.dev", *KOPF_PEERING_CRDS):
        annotations = argo[("CustomResourceDefinition", name)]["metadata"]["annotations"]
        assert annotations == {KEEP: "keep", "argocd.argoproj.io/sync-options": "Prune=false"}
    # Another kopf operator installed kopf's peering CRDs already: Helm must not try to own them.
    shared = by_identity(helm_template("kopfPeering.installCRD=false"))
    for name in KOPF_PEERING_CRDS:
        assert ("CustomResourceDefinition", name) not in shared
    assert ("CustomResourceDefinition", "inferenceservices.pagoda.dev") in shared


def test_monitoring_objects_are_those_of_the_monitoring_kustomization():
    chart = by_identity(
        helm_template("prometheusAdapter.rulesConfigMap.enabled=true", "grafanaDashboard.enabled=true")
    )
    for identity, obj in by_identity(kustomize(ROOT / "manifests" / "monitoring")).items():
        assert chart[identity] == obj, identity


def test_the_adapter_chart_values_hold_the_same_rule_as_the_config_map():
    config_map = yaml.safe_load(
        (ROOT / "manifests" / "monitoring" / "prometheus-adapter-rules.yaml").read_text()
    )
    values = yaml.safe_load(
        (ROOT / "manifests" / "monitoring" / "prometheus-adapter-values.yaml").read_text()
    )
    assert values["rules"]["custom"] == yaml.safe_load(config_map["data"]["config.yaml"])["rules"]


def test_helm_lint_passes():
    out = _run(_tool("helm"), "lint", str(CHART), "--kube-version", KUBE_VERSION)
    assert "1 chart(s) linted, 0 chart(s) failed" in out
