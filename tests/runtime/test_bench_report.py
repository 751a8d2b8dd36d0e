"""BENCHMARKS.md's tables are what their committed JSON results say, figure for figure."""

from __future__ import annotations

import json
import shutil

from benchmarks.report import BENCHMARKS_MD, RESULTS, stale_tables, update
from benchmarks.tables import TABLES


def test_every_table_matches_its_json():
    assert stale_tables(BENCHMARKS_MD.read_text(), TABLES) == [], "rewrite them: python -m benchmarks.report"


def test_a_figure_changed_in_its_json_makes_its_table_stale(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    path = results / "cpu" / "throughput_mixed.json"
    result = json.loads(path.read_text())
    result["results"]["output_tok_per_s"] *= 2
    path.write_text(json.dumps(result))
    markdown = BENCHMARKS_MD.read_text()
    assert stale_tables(markdown, TABLES, results) == ["mixed-lengths-cpu"]
    assert stale_tables(update(markdown, TABLES, results), TABLES, results) == []
