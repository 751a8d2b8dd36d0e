"""The kind end-to-end run (needs Docker and kind; skipped elsewhere by the e2e marker)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_kind_end_to_end_serves_and_rolls_without_losing_requests():
    result = subprocess.run(["bash", str(ROOT / "e2e" / "kind" / "run.sh")], cwd=ROOT, timeout=3600)
    assert result.returncode == 0
