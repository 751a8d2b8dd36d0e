"""Skips the tests whose hardware or tools this machine lacks, saying which and why."""

from __future__ import annotations

import shutil
import subprocess

# Before anything imports triton (transformers does): the Triton kernels compile where CUDA is
# visible and run in Triton's interpreter elsewhere.
import pagoda_runtime.triton_mode  # noqa: F401
import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _docker_engine_available() -> bool:
    if shutil.which("docker") is None or shutil.which("kind") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
    return probe.returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wants_gpu = any("gpu" in item.keywords for item in items)
    wants_e2e = any("e2e" in item.keywords for item in items)
    skip_gpu = (
        None
        if not wants_gpu or _cuda_available()
        else pytest.mark.skip(reason="needs a CUDA GPU; none is visible to torch on this machine")
    )
    skip_e2e = (
        None
        if not wants_e2e or _docker_engine_available()
        else pytest.mark.skip(reason="needs a running Docker engine and kind; see e2e/kind/README.md")
    )
    for item in items:
        if skip_gpu and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        if skip_e2e and "e2e" in item.keywords:
            item.add_marker(skip_e2e)
