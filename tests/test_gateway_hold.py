"""The Traefik hold middleware (gateway/traefik/hold), by its Go tests: stdlib only, no network."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HOLD = Path(__file__).resolve().parents[1] / "gateway" / "traefik" / "hold"


def test_the_hold_middleware_holds_retries_and_answers_retry_after(tmp_path):
    if shutil.which("go") is None:
        pytest.skip("needs Go on PATH")
    work = shutil.copytree(HOLD, tmp_path / "hold")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(
        ["go", "test", "-count=1", "./..."], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
