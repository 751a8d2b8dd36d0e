"""`pagoda-runtime bench serve` against the serving process over the fake engine."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pagoda_runtime.bench.stats import percentiles

from .conftest import ServerProcess

SWEEPS = ["-m", "pagoda_runtime.bench.sweeps"]


def test_percentiles_match_numpy():
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.5, 0.05]
    result = percentiles(values)
    for q in (50, 95, 99):
        assert result[f"p{q}"] == pytest.approx(np.percentile(values, q))
    assert result["mean"] == pytest.approx(np.mean(values))


def test_bench_serve_reports_latencies_and_throughput(tmp_path):
    server = ServerProcess(log_dir=tmp_path, fake=True)
    try:
        server.wait_ready(30)
        result_json = tmp_path / "result.json"
        command = [sys.executable, "-m", "pagoda_runtime.cli", "bench", "serve", "--base-url", server.url]
        command += ["--num-prompts", "12", "--request-rate", "20", "--random-input-len", "16"]
        command += [
            "--random-output-len",
            "8",
            "--random-vocab-size",
            "200",
            "--result-json",
            str(result_json),
        ]
        run = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "TTFT" in run.stdout and "output throughput" in run.stdout
        result = json.loads(result_json.read_text())
        assert (result["completed"], result["failed"]) == (12, 0)
        assert (result["total_input_tokens"], result["total_output_tokens"]) == (12 * 16, 12 * 8)
        for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            row = result[name]
            assert 0 < row["p50"] <= row["p95"] <= row["p99"], (name, row)
        assert result["e2e_s"]["p50"] > result["ttft_s"]["p50"]
        assert result["output_throughput"] > 0
    finally:
        server.stop()


def test_rate_sweep_writes_a_table_and_a_plot_per_rate(tmp_path):
    server = ServerProcess(log_dir=tmp_path, fake=True)
    try:
        server.wait_ready(30)
        out = tmp_path / "sweep"
        command = [sys.executable, *SWEEPS, "rate", "--base-url", server.url, "--rates", "10,40"]
        command += [
            "--num-prompts",
            "6",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--random-vocab-size",
            "200",
        ]
        run = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        table = json.loads((out / "latency_vs_rate.json").read_text())
        assert [row["rate"] for row in table["rows"]] == [10, 40]
        for row in table["rows"]:
            assert 0 < row["ttft_p50_s"] <= row["ttft_p95_s"] and 0 < row["tpot_p50_s"] <= row["tpot_p95_s"]
            per_rate = json.loads((out / f"serve-rate-{row['rate']:g}.json").read_text())
            assert per_rate["completed"] == 6 and per_rate["total_output_tokens"] == 6 * 4
        assert (out / "latency_vs_rate.png").read_bytes().startswith(b"\x89PNG")
    finally:
        server.stop()
