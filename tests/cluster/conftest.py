"""The `control_plane` fixture: a real kube-apiserver/etcd/controller-manager/scheduler/kwok on
loopback (e2e/controlplane/controlplane.py), started once per test session.

The first run builds the pinned binaries (e2e/controlplane/build.sh, several minutes on 2 cores);
later runs reuse ${PAGODA_TOOLS_CACHE:-~/.cache/pagoda-tools} and start in ~10 s.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_CP_FILE = Path(__file__).resolve().parents[2] / "e2e" / "controlplane" / "controlplane.py"


def _load_controlplane():
    name = "pagoda_e2e_controlplane"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _CP_FILE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


controlplane = _load_controlplane()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    missing = [
        n for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                    "kubectl", "kwok")
        if not controlplane.binary_path(n).exists()
    ]
    if missing and shutil.which("go") is None:
        pytest.skip(f"control-plane binaries {missing} are not built and Go is not on PATH "
                    "(run e2e/controlplane/build.sh)")
    if shutil.which("openssl") is None:
        pytest.skip("the loopback control plane needs openssl on PATH")
    cp = controlplane.ControlPlane()
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()
