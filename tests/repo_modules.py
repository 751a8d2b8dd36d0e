"""The harness modules that live outside the Python packages (e2e/controlplane, e2e/node), loaded by
path once, so that tests/cluster and tests/e2e use the same module objects."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


controlplane = _load("pagoda_e2e_controlplane", ROOT / "e2e" / "controlplane" / "controlplane.py")
node = _load("pagoda_e2e_node", ROOT / "e2e" / "node" / "node.py")
