"""scripts/gpu-bench.sh on tiny shapes: every part's command line runs and writes the results the
targets are read from, a part past its time limit is stopped and recorded, and the targets table
never judges a figure of another shape against the Llama-3-8B bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pagoda_runtime.bench import targets

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    return subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu-bench.sh"),
            "--out",
            str(tmp_path / "out"),
            "--wheels",
            str(wheels),
        ]
        + ["--site", str(tmp_path / "site"), *args],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _parts(out: Path) -> dict[str, int]:
    return {
        line.split("\t")[0]: int(line.split("\t")[1]) for line in (out / "parts.tsv").read_text().splitlines()
    }


@pytest.mark.slow
def test_every_part_runs_on_tiny_shapes_and_the_targets_read_its_results(tmp_path):
    parts = ["decode", "quant", "batch", "offline", "serve", "profile", "stretch"]
    result = _bench(tmp_path, "--smoke", *parts)
    out = tmp_path / "out"
    assert result.returncode == 0, result.stderr + "".join(
        (out / f"{p}.log").read_text()[-2000:] for p in parts if (out / f"{p}.log").exists()
    )
    assert _parts(out) == dict.fromkeys(parts, 0)
    latency = json.loads((out / "latency_b1.json").read_text())["results"]
    assert latency["decode_tok_per_s"] > 0 and latency["speedup_vs_hf"] > 0
    speed = json.loads((out / "quantization_speed.json").read_text())
    assert [row["quantization"] for row in speed["rows"]] == ["none", "int8"]
    # The profile part's second run: the same step with each step's tokens read before the next launch.
    in_order = json.loads((out / "in_order_profile_tiny-llama_b2.json").read_text())
    assert in_order["async_scheduling"] is False and in_order["detokenize"] is True
    assert in_order["host_parts_ms_median"]["sample"] == 0
    rate = json.loads((out / "serve-rate-inf.json").read_text())
    assert rate["completed"] == 4 and rate["failed"] == 0
    rows = {row["target"]: row for row in json.loads((out / "targets.json").read_text())}
    assert rows.keys() == {t.name for t in targets.TARGETS}
    decode = rows["batch-1 bf16 decode tok/s"]
    assert decode["measured"] == latency["decode_tok_per_s"]
    assert decode["verdict"] == "not comparable (tiny-llama, not llama-3-8b)"
    assert rows["int4 batch-1 decode, x bf16"]["verdict"] == "not measured"


def test_a_part_past_its_limit_is_stopped_and_recorded(tmp_path):
    result = _bench(tmp_path, "--smoke", "--part-timeout", "1", "offline", timeout=60)
    assert result.returncode == 1
    assert _parts(tmp_path / "out") == {"offline": 124}


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
    profile = {"model": "llama-3-8b", "host_ms_median": 3.0, "step_wall_ms_median": 20.0}
    profile["device_idle_share"] = 0.04
    (tmp_path / "step_profile_llama-3-8b_none_b256.json").write_text(json.dumps(profile))
    rows = {row["target"]: row["verdict"] for row in targets.check_all(tmp_path)}
    assert rows["batch-1 bf16 decode tok/s"] == "met"
    assert rows["batch-1 decode, fraction of roofline"] == "missed"
    assert rows["host share of a step at 256 sequences"] == "missed"
    assert rows["GPU idle share of a step at 256 sequences"] == "met"
    assert rows["offline 8B, x transformers"] == "not measured"
