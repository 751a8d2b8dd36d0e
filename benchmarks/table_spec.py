"""A table of BENCHMARKS.md as data: the JSON results it reads, how its rows come out of them,
and its columns (report.py writes the tables, tables.py lists them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict], str]  # the row's text in this column


def one_row_per_file(results: list[dict]) -> list[dict]:
    return results


@dataclass(frozen=True)
class Table:
    name: str  # the marker in BENCHMARKS.md
    sources: tuple[str, ...]  # JSON files, relative to benchmarks/results/
    columns: tuple[Column, ...]
    rows: Callable[[list[dict]], list[dict]] = one_row_per_file  # the loaded sources -> rows

    def render(self, results_dir: Path = RESULTS) -> str:
        loaded = [json.loads((results_dir / source).read_text()) for source in self.sources]
        lines = [
            "| " + " | ".join(c.header for c in self.columns) + " |",
            "|" + "---|" * len(self.columns),
        ]
        for row in self.rows(loaded):
            lines.append("| " + " | ".join(c.cell(row) for c in self.columns) + " |")
        return "\n".join(lines) + "\n"
