"""How a benchmark script hands back its result: printed, and written as JSON where --result-json
asks, which is what BENCHMARKS.md's tables are written from (report.py)."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, result_json: str | None) -> None:
    text = json.dumps(result, indent=2)
    if result_json:
        Path(result_json).write_text(text + "\n")
    print(text)
