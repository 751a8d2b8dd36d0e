"""`pagoda-runtime bench serve` against the serving process over the fake engine."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from pagoda_runtime.bench.stats import percentiles

from benchmarks.sweeps import saturation

from .conftest import ServerProcess

SWEEPS = ["-m", "benchmarks.sweeps"]


def test_percentiles_match_numpy():
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.5, 0.05]
    result = percentiles(values)
    for q in (50, 95, 99):
        assert result[f"p{q}"] == pytest.approx(np.percentile(values, q))
    assert result["mean"] == pytest.approx(np.mean(values))


def test_saturation_is_the_lowest_rate_near_the_highest_throughput_or_says_what_to_sweep():
    def rows(*pairs):
        return [{"rate": rate, "output_tok_per_s": tok_per_s} for rate, tok_per_s in pairs]

    flat = saturation(rows((2, 100.0), (4, 190.0), (8, 290.0), (16, 300.0), ("inf", 305.0)))
    assert flat["rate"] == 8 and flat["output_tok_per_s"] == 305.0
    assert flat["verdict"].startswith("output throughput stops growing at 8 req/s: 290.0 tok/s")
    growing = saturation(rows((2, 100.0), (4, 190.0), ("inf", 400.0)))
    assert growing["rate"] is None and "between them" in growing["verdict"]
    assert saturation(rows((2, 100.0), (4, 190.0)))["verdict"].endswith("add higher rates or inf")


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


def test_rate_sweep_serves_random_weights_itself_up_to_an_unlimited_rate(tmp_path):
    out = tmp_path / "sweep"
    serve = "--model tiny-llama --load-format dummy --device cpu --max-model-len 256 --canary-interval 1"
    command = [sys.executable, *SWEEPS, "rate", "--serve", serve, "--rates", "inf,2,4", "--num-prompts", "4"]
    command += ["--input-len", "8", "--output-len", "4", "--random-vocab-size", "512", "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "the server drained and exited 0" in run.stdout
    table = json.loads((out / "latency_vs_rate.json").read_text())
    assert table["model"] == "tiny-llama" and table["serve"] == serve
    assert [row["rate"] for row in table["rows"]] == [2, 4, "inf"]
    for row, name in zip(table["rows"], ("2", "4", "inf"), strict=True):
        per_rate = json.loads((out / f"serve-rate-{name}.json").read_text())
        assert per_rate["completed"] == 4 and per_rate["total_output_tokens"] == 4 * 4
        assert row["output_tok_per_s"] == per_rate["output_throughput"] > 0
    saturation = table["saturation"]
    best = max(row["output_tok_per_s"] for row in table["rows"])
    assert saturation["output_tok_per_s"] == best and saturation["rate"] in (2, 4, None)
    assert saturation["verdict"] in run.stdout
    assert (out / "latency_vs_rate.png").read_bytes().startswith(b"\x89PNG")
    assert "load_format=dummy" in (out / "server.log").read_text()


def test_a_sweep_ended_by_sigterm_stops_the_server_it_started(tmp_path):
    out = tmp_path / "sweep"
    serve = "--model tiny-llama --load-format dummy --device cpu --max-model-len 256"
    command = [sys.executable, *SWEEPS, "rate", "--serve", serve, "--rates", "0.1", "--num-prompts", "50"]
    sweep = subprocess.Popen(
        [*command, "--random-vocab-size", "512", "--out", str(out)], stdout=subprocess.DEVNULL
    )
    try:
        log = out / "server.log"
        deadline = time.monotonic() + 120
        while "model loaded" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and sweep.poll() is None, "the server never got ready"
            time.sleep(0.2)
        server_pid = int(re.search(r"Started server process \[(\d+)\]", log.read_text()).group(1))
        sweep.send_signal(signal.SIGTERM)
        assert sweep.wait(60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)
    finally:
        sweep.kill()
        sweep.wait()
