"""`python -m benchmarks.detokenize`: the detokenizer's cost per token, with and without a stop."""

from __future__ import annotations

import json

import pytest

from benchmarks import detokenize


def test_both_cases_are_timed_and_written(tmp_path):
    out = tmp_path / "detokenize.json"
    assert detokenize.main(["--tokens", "40", "--rounds", "1", "--result-json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["sequences"], result["tokens"]) == (256, 35)
    assert [row["case"] for row in result["rows"]] == ["no stop string", "one stop string"]
    for row in result["rows"]:
        assert row["us_per_token"] > 0
        assert row["ms_per_step_at_256"] == pytest.approx(row["us_per_token"] * 256 / 1e3)
