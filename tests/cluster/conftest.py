"""The `control_plane` fixture: a real kube-apiserver/etcd/controller-manager/scheduler/kwok on
loopback (e2e/controlplane/controlplane.py), started once per test session; on top of it Pagoda
installed from manifests/ and the real operator running with exactly that install's RBAC.

The first run builds the pinned binaries (e2e/controlplane/build.sh, several minutes on 2 cores);
later runs reuse ${PAGODA_TOOLS_CACHE:-~/.cache/pagoda-tools} and start in ~10 s.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_process import OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, OperatorProcess
from repo_modules import ROOT, controlplane

# Short, so that tests can watch the operator reconcile again and again within seconds.
RESYNC_SECONDS = 2.0


def started_control_plane() -> Iterator[controlplane.ControlPlane]:
    """A fresh loopback control plane for the caller's lifetime, or a skip that says what is missing."""
    missing = [
        n
        for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
        if not controlplane.binary_path(n).exists()
    ]
    if missing and shutil.which("go") is None:
        pytest.skip(
            f"control-plane binaries {missing} are not built and Go is not on PATH "
            "(run e2e/controlplane/build.sh)"
        )
    if shutil.which("openssl") is None:
        pytest.skip("the loopback control plane needs openssl on PATH")
    cp = controlplane.ControlPlane()
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    yield from started_control_plane()


@pytest.fixture(scope="session")
def pagoda_install(control_plane) -> str:
    """What README.md tells users to run: `kubectl apply -k manifests/`; returns kubectl's output."""
    out = control_plane.kubectl("apply", "-k", str(ROOT / "manifests")).stdout
    control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s", "crd/inferenceservices.pagoda.dev"
    )
    return out


def write_operator_kubeconfig(control_plane, path: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the operator's ServiceAccount: its RBAC, nothing more."""
    token = control_plane.kubectl(
        "create", "token", OPERATOR_ACCOUNT, "-n", OPERATOR_NAMESPACE, "--duration=2h"
    ).stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "loopback",
                "cluster": {"server": control_plane.server, "certificate-authority": control_plane.ca_file},
            }
        ],
        "users": [{"name": OPERATOR_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "loopback", "user": OPERATOR_ACCOUNT}}],
        "current-context": "operator",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def operator_kubeconfig(control_plane, pagoda_install, tmp_path_factory) -> Path:
    return write_operator_kubeconfig(control_plane, tmp_path_factory.mktemp("operator") / "kubeconfig")


@pytest.fixture(scope="module")
def pagoda_operator(operator_kubeconfig, tmp_path_factory) -> Iterator[OperatorProcess]:
    """The operator for one test module; afterwards its logs must show no failed handler and no
    request that manifests/rbac.yaml did not allow."""
    operator = OperatorProcess(
        operator_kubeconfig, tmp_path_factory.mktemp("operator-logs"), resync_seconds=RESYNC_SECONDS
    )
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
    failures = operator.failures()
    assert not failures, f"the operator failed (logs in {operator.logs_dir}):\n" + "\n".join(failures[:10])


@pytest.fixture(scope="session")
def lws_controller(control_plane) -> None:
    """LeaderWorkerSet installed and its controller running, for InferenceServices spanning nodes."""
    control_plane.start_lws_controller()


@pytest.fixture
def isvc_namespace(control_plane) -> Iterator[str]:
    """A fresh namespace per test, deleted (with everything in it) afterwards. It enforces the
    restricted Pod Security Standard, which the runtime pods must pass to be created at all."""
    namespace = f"op-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    control_plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    yield namespace
    control_plane.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
