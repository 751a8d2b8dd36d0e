"""The distribution's promises: console scripts, extras, Python versions, bundled model."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_console_scripts_are_installed():
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["pagoda-runtime"] == "pagoda_runtime.cli:main"
    assert scripts["pagoda-operator"] == "pagoda_operator.cli:main"


def test_torch_is_pinned_to_the_gpu_image_line():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = pyproject["project"]["optional-dependencies"]["runtime"]
    assert "torch==2.11.0" in runtime and "triton==3.6.0" in runtime
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.11.0" in constraints and "triton==3.6.0" in constraints


def test_dockerfiles_install_the_matching_extras():
    runtime = (ROOT / "images" / "runtime.Dockerfile").read_text()
    operator = (ROOT / "images" / "operator.Dockerfile").read_text()
    assert ".[runtime]" in runtime and "constraints.txt" in runtime
    assert ".[operator]" in operator and "constraints.txt" in operator
    assert "torch" not in operator
    for dockerfile in (runtime, operator):
        assert "\nUSER " in dockerfile


def test_runtime_package_imports_without_torch_for_its_light_modules():
    code = (
        "import sys, pagoda_runtime, pagoda_runtime.contract.bundled, pagoda_runtime.contract.sizing,"
        " pagoda_runtime.contract.quantization_selection, pagoda_runtime.engine.protocol;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
