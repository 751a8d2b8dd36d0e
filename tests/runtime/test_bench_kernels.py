"""`python -m benchmarks.moe_kernels` and `... lora_kernels` on tiny shapes (--smoke; in
Triton's interpreter here): each checks the kernels against the reference, times them and writes
the rows the GPU run reports."""

from __future__ import annotations

import json

import pytest

from benchmarks import lora_kernels, moe_kernels


@pytest.mark.slow
def test_moe_benchmark_checks_and_times_every_kind(tmp_path):
    out = tmp_path / "moe.json"
    args = ["--smoke", "--check", "--kinds", "bf16,int8", "--batches", "1,5", "--result-json", str(out)]
    assert moe_kernels.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    cases = [(kind, batch) for kind in ("bf16", "int8") for batch in (1, 5)]
    # The plain experts, then GPT-OSS's with their biases and clamped SwiGLU.
    expected = [(model, *case) for model in ("tiny", "tiny-gpt-oss") for case in cases]
    assert [(r["model"], r["experts"], r["batch"]) for r in rows] == expected
    for row in rows:
        assert row["us"] > 0 and row["roofline_us"] > 0
        assert 1 <= row["distinct_experts"] <= min(8, 2 * row["batch"])


@pytest.mark.slow
def test_lora_benchmark_reports_the_overhead_of_each_projection(tmp_path):
    out = tmp_path / "lora.json"
    assert lora_kernels.main(["--smoke", "--check", "--result-json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["projection"] for r in result["rows"]] == ["qkv", "down"]
    for row in result["rows"]:
        assert row["base_us"] > 0 and row["base_plus_lora_us"] > 0
        assert row["overhead"] == pytest.approx(row["base_plus_lora_us"] / row["base_us"] - 1)
    assert result["overhead_over_projections"] > 0
