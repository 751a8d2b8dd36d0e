"""scripts/gpu-bench.sh on tiny shapes: every part's command line runs and writes the results the
targets are read from, a part past its time limit or too close to the deadline is stopped or
skipped and recorded, a detached run outlives the command that started it and is packed as it
goes, and the targets table never judges a figure of another shape against the Llama-3-8B
bounds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from benchmarks import targets

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path: Path, *args: str, mode: tuple[str, ...] = (), timeout: float = 300):
    """gpu-bench.sh [MODE] --out tmp/out --wheels (none) --site tmp/site ARGS."""
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-bench.sh"), *mode, "--out", str(tmp_path / "out")]
        + ["--wheels", str(wheels), "--site", str(tmp_path / "site"), *args],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _collect(out: Path, wait: int, archive: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-bench.sh"), "collect", "--out", str(out)]
        + ["--wait", str(wait), "--archive", str(archive)],
        capture_output=True,
        text=True,
        timeout=wait + 60,
    )


def _parts(text: str) -> dict[str, int | str]:
    rows = [line.split("\t") for line in text.splitlines()]
    return {name: int(rc) if rc.isdigit() else rc for name, rc, _ in rows}


@pytest.mark.slow
def test_every_part_runs_on_tiny_shapes_and_the_targets_read_its_results(tmp_path):
    parts = [
        "tests",
        "decode",
        "batch",
        "quant",
        "profile",
        "kernels",
        "spec-lora",
        "priority",
        "offline",
        "serve",
        "stretch",
    ]
    result = _bench(tmp_path, "--smoke", *parts, timeout=900)
    out = tmp_path / "out"
    assert result.returncode == 0, result.stderr + "".join(
        (out / f"{p}.log").read_text()[-2000:] for p in parts if (out / f"{p}.log").exists()
    )
    assert _parts((out / "parts.tsv").read_text()) == dict.fromkeys(parts, 0)
    assert "skipped" in (out / "tests.log").read_text()  # no CUDA here: every gpu test skips
    latency = json.loads((out / "latency_b1.json").read_text())["results"]
    assert latency["decode_tok_per_s"] > 0 and latency["speedup_vs_hf"] > 0
    speed = json.loads((out / "quantization_speed.json").read_text())
    assert [row["quantization"] for row in speed["rows"]] == ["none", "int8"]
    # The profile part's second run: the same step with each step's tokens read before the next launch.
    in_order = json.loads((out / "in_order_profile_tiny-llama_b2.json").read_text())
    assert in_order["async_scheduling"] is False and in_order["detokenize"] is True
    assert in_order["host_parts_ms_median"]["sample"] == 0
    # The kernels part: every path at each batch, the routing table they give, the attention kernel.
    kernels = json.loads((out / "quant_kernels.json").read_text())
    assert kernels["failures"] == [] and {r["kind"] for r in kernels["results"]} == {
        "dense",
        "int8",
        "fp8",
        "int4",
    }
    assert json.loads((out / "dispatch_table.json").read_text())["routes"].keys() == {
        "dense",
        "int8",
        "fp8",
        "int4",
    }
    attention = json.loads((out / "attention_kernels.json").read_text())
    assert {r["cache"] for r in attention["decode"]} == {"bf16", "fp8"} and attention["prefill"]
    assert [r["query_len"] for r in attention["verify"]] == [5]
    latent = attention["latent_decode"]
    assert "DeepSeek-V3" in latent["what"] and [r["batch"] for r in latent["rows"]] == [1, 2]
    assert all(r["GBps"] > 0 and r["fraction_of_copy"] > 0 for r in latent["rows"])
    # The spec-lora part: both proposers at each batch, lossless; the adapters' step beside the base's.
    spec = json.loads((out / "spec_decode_tiny-llama.json").read_text())
    assert [(r["proposer"], r["batch"]) for r in spec["rows"]] == [
        ("ngram", 1),
        ("ngram", 2),
        ("draft_model", 1),
        ("draft_model", 2),
    ]
    assert all(r["outputs_identical"] for r in spec["rows"])
    assert any(r["drafts"] for r in spec["rows"])
    lora = json.loads((out / "lora_decode_step.json").read_text())
    assert lora["adapters_step_s"] > 0 and lora["base_step_s"] > 0
    # The priority part: interactive requests idle and under the batch load, both policies.
    priority = json.loads((out / "priority_ttft_tiny-llama.json").read_text())
    assert [r["policy"] for r in priority["results"]] == ["priority", "fcfs"]
    assert all(r["idle"]["n"] == 2 and r["loaded"]["n"] > 0 for r in priority["results"])
    rate = json.loads((out / "serve-rate-inf.json").read_text())
    assert rate["completed"] == 4 and rate["failed"] == 0
    rows = {row["target"]: row for row in json.loads((out / "targets.json").read_text())}
    assert rows.keys() == {t.name for t in targets.TARGETS}
    decode = rows["batch-1 bf16 decode tok/s"]
    assert decode["measured"] == latency["decode_tok_per_s"]
    assert decode["verdict"] == "not comparable (tiny-llama, not llama-3-8b)"
    assert rows["int4 batch-1 decode, x bf16"]["verdict"] == "not measured"
    priority_row = rows["interactive TTFT p95 under a batch load, x idle (priority policy)"]
    assert priority_row["measured"] == priority["results"][0]["loaded_over_idle_p95"]
    assert priority_row["verdict"] == "not comparable (tiny-llama, not llama-3-8b)"
    lora_row = rows["decode step, batch 32 with 4 LoRA adapters of rank 16, over the base"]
    assert lora_row["measured"] == lora["adapters_overhead"]
    assert lora_row["verdict"] == "not comparable (tiny-llama, not llama-3-8b)"


def test_a_part_past_its_limit_is_stopped_and_recorded(tmp_path):
    result = _bench(tmp_path, "--smoke", "--budget", "offline=1", "offline", timeout=120)
    assert result.returncode == 1
    assert _parts((tmp_path / "out" / "parts.tsv").read_text()) == {"offline": 124}


def test_a_part_without_time_before_the_deadline_is_skipped(tmp_path):
    result = _bench(tmp_path, "--smoke", "--deadline", "20", "decode", timeout=120)
    assert result.returncode == 1
    assert _parts((tmp_path / "out" / "parts.tsv").read_text()) == {"decode": "skipped"}
    assert "decode skipped" in (tmp_path / "out" / "progress.log").read_text()


def test_a_detached_run_outlives_its_command_runs_one_part_at_a_time_and_is_packed(tmp_path):
    out = tmp_path / "out"
    started = time.monotonic()
    start = _bench(tmp_path, "--deadline", "400", "--smoke", "decode", "tests", mode=("start",), timeout=60)
    assert start.returncode == 0, start.stderr
    assert time.monotonic() - started < 30, "start waited for the run"
    try:
        early = _collect(out, 0, tmp_path / "early.tar.gz")
        assert early.returncode == 0, early.stderr
        assert "still running" in early.stdout
        final = _collect(out, 360, tmp_path / "final.tar.gz")
        assert "the run is done, exit status 0" in final.stdout, final.stdout + (out / "run.log").read_text()
        with tarfile.open(tmp_path / "final.tar.gz") as archive:
            names = set(archive.getnames())
            assert {"./parts.tsv", "./gpu-tests.xml", "./latency_b1.json", "./targets.json"} <= names
            # The checkout copy the run worked on stays behind.
            assert not [n for n in names if n.startswith(("./.tree", "./.site"))]
            assert _parts(archive.extractfile("./parts.tsv").read().decode()) == {"tests": 0, "decode": 0}
            events = [
                line.split(" ", 1)[1].split(":")[0]
                for line in archive.extractfile("./progress.log").read().decode().splitlines()
            ]
        # One part at a time, the gpu tests first whatever the order named, each with its own limit.
        assert events == [
            "tests started, at most 240s",
            "tests ended",
            "decode started, at most 120s",
            "decode ended",
        ]
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.killpg(int((out / "pid").read_text()), signal.SIGKILL)


def test_a_second_start_into_a_busy_folder_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "pid").write_text("1\n")
    result = _bench(tmp_path, "--deadline", "60", "decode", mode=("start",), timeout=30)
    assert result.returncode == 2
    assert "already holds a run; collect it, or give start a new --out" in result.stderr


def test_an_unknown_part_is_refused_with_the_list(tmp_path):
    result = _bench(tmp_path, "decoder", timeout=30)
    assert result.returncode == 2
    assert "unknown part or option decoder; see --help" in result.stderr


def test_targets_judge_only_their_own_shape(tmp_path):
    results = {
        "shape": "llama-3-8b",
        "results": {"decode_tok_per_s": 180.0, "decode_fraction_of_roofline_batch1": 0.8},
    }
    (tmp_path / "latency_b1.json").write_text(json.dumps(results))
    profile = {"model": "llama-3-8b", "device_idle_share": 0.15}
    (tmp_path / "step_profile_llama-3-8b_none_b256.json").write_text(json.dumps(profile))
    checked = {row["target"]: row for row in targets.check_all(tmp_path)}
    rows = {name: row["verdict"] for name, row in checked.items()}
    assert rows["batch-1 bf16 decode tok/s"] == "met"
    assert rows["batch-1 decode, fraction of roofline"] == "missed"
    idle = checked["GPU idle share of a step at 256 sequences"]
    assert idle["measured"] == pytest.approx(0.15) and idle["verdict"] == "missed"
    assert rows["offline 8B, x transformers"] == "not measured"
