"""Skips the tests whose hardware this machine lacks, saying which and why. (The e2e tests skip in
their cluster fixture, tests/e2e/conftest.py, which knows what its provider needs.)"""

from __future__ import annotations

# Before anything imports triton (transformers does): the Triton kernels compile where CUDA is
# visible and run in Triton's interpreter elsewhere.
import pagoda_runtime.executor.triton_mode  # noqa: F401
import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wants_gpu = any("gpu" in item.keywords for item in items)
    skip_gpu = (
        None
        if not wants_gpu or _cuda_available()
        else pytest.mark.skip(reason="needs a CUDA GPU; none is visible to torch on this machine")
    )
    for item in items:
        if skip_gpu and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
