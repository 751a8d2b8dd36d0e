"""`python -m benchmarks.step_profile`: per-step wall and kernel time, on the CPU."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pagoda_runtime.bench import offline
from pagoda_runtime.bench.workload import offline_engine
from pagoda_runtime.executor.sampler import Sampler

from benchmarks import step_profile
from benchmarks.tables import TABLES


def test_each_step_reports_wall_kernel_gap_host_and_launches(tmp_path, capsys):
    args = ["--shape", "tiny-llama", "--device", "cpu", "--batch-sizes", "1,3", "--steps", "3"]
    assert step_profile.main([*args, "--input-len", "8", "--decoded", "6", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "wall ms  kernel ms  idle gap ms  host ms  launches" in printed
    for batch in (1, 3):
        summary = json.loads((tmp_path / f"step_profile_tiny-llama_none_b{batch}.json").read_text())
        assert (summary["batch"], summary["device"], summary["quantization"]) == (batch, "cpu", "none")
        assert "ATen" in summary["kernel_time_is"]  # the CPU has no kernels: said, not hidden
        steps = summary["steps_profiled"]
        assert len(steps) == 3
        for step in steps:
            assert step["num_seqs"] == batch  # every sequence decodes in every profiled step
            assert 0 < step["kernel_ms"] <= step["wall_ms"]
            assert step["idle_gap_ms"] == pytest.approx(step["wall_ms"] - step["kernel_ms"])
            assert 0 < step["host_ms"] < step["wall_ms"]
            assert 0 < step["launches"] < step["kernels"]
            assert step["cuda_graph_batch"] is None
        assert summary["cuda_graph_steps"] == 0
        assert summary["decoded"] == 6
        host = summary["host_parts_ms_median"]
        assert list(host) == ["schedule", "prepare", "launch", "wait", "append", "sample", "emit", "host"]
        assert all(host[part] > 0 for part in ("schedule", "prepare", "launch", "append", "emit", "host"))
        # A CPU reads each step's tokens before the next launch: no sampling waits for them.
        assert host["sample"] == 0 and summary["async_scheduling"] is False
        assert host["host"] < summary["step_wall_ms_median"]
        assert 0 <= summary["device_idle_share"] < 1
        assert summary["kernel_ms_median"] <= summary["profiled_step_ms"]
        top = summary["top_kernels"]
        assert [k["ms_per_step"] for k in top] == sorted((k["ms_per_step"] for k in top), reverse=True)
        assert 0 < sum(k["share"] for k in top) <= 1
        assert "aten::mm" in {k["name"] for k in top}
        assert "parts_ms" not in summary
        assert summary["aten_ops_per_layer"] == summary["aten_ops_per_step"] / 2  # tiny-llama: 2 layers


def test_async_scheduling_is_profiled_on_the_cpu_too(tmp_path):
    args = ["--shape", "tiny-llama", "--device", "cpu", "--batch-sizes", "2", "--steps", "3"]
    args += ["--input-len", "8", "--async-scheduling", "--out", str(tmp_path)]
    assert step_profile.main(args) == 0
    summary = json.loads((tmp_path / "step_profile_tiny-llama_none_b2.json").read_text())
    assert summary["async_scheduling"] is True
    assert all(step["num_seqs"] == 2 for step in summary["steps_profiled"])
    assert summary["host_parts_ms_median"]["wait"] >= 0


def test_the_bundled_models_profile_fills_the_committed_cpu_table(tmp_path):
    # BENCHMARKS.md's decode-profile-cpu table is written from this tool's JSON.
    args = ["--model", "smollm2-135m", "--device", "cpu", "--batch-sizes", "1", "--steps", "2"]
    args += ["--input-len", "9", "--parts", "--name", "decode_profile_auto", "--out", str(tmp_path)]
    assert step_profile.main(args) == 0
    summary = json.loads((tmp_path / "decode_profile_auto_b1.json").read_text())
    parts = summary["parts_ms"]
    assert list(parts) == list(step_profile.PARTS)
    assert all(parts[name] > 0 for name in parts)
    assert sum(parts[name] for name in step_profile.INSIDE_LAYERS) <= parts["decoder layers (all)"]
    (table,) = [t for t in TABLES if t.name == "decode-profile-cpu"]
    rendered = dataclasses.replace(table, sources=("decode_profile_auto_b1.json",)).render(tmp_path)
    assert rendered.splitlines()[2].startswith("| auto (gguf) | 1 | ")


def test_the_part_labels_are_taken_off_again():
    # Left on, they would slow every later step of the same engine (the next batch size's timing).
    config = offline.OfflineConfig(offline_engine("tiny-llama", device="cpu", max_num_seqs=2))
    engine = offline.build_engine(config, 64)
    layer, call = engine.runner.model.layers[0], Sampler.__call__
    ops = layer.self_attn.ops
    with step_profile.labelled_parts(engine):
        assert "forward" in vars(layer) and Sampler.__call__ is not call and layer.self_attn.ops is not ops
    assert "forward" not in vars(layer) and Sampler.__call__ is call
    assert "_prepare" not in vars(engine.runner) and "schedule" not in vars(engine.scheduler)
    assert layer.self_attn.ops is ops


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True])
def test_on_cuda_kernels_are_device_time_and_graph_replays_are_seen(tmp_path, eager):
    args = ["--shape", "tiny-llama", "--device", "cuda", "--batch-sizes", "1,3", "--steps", "3"]
    args += ["--input-len", "8", "--kv-cache-memory", str(2**28), "--out", str(tmp_path)]
    assert step_profile.main(args + (["--enforce-eager"] if eager else [])) == 0
    for batch in (1, 3):
        summary = json.loads(next(tmp_path.glob(f"step_profile_tiny-llama_*_b{batch}.json")).read_text())
        assert summary["kernel_time_is"].startswith("CUDA")
        assert summary["cuda_graph_steps"] == (0 if eager else 3)
        steps = summary["steps_profiled"]
        # One stream: kernels do not overlap. A step's kernels may run on into the next step's
        # time (async scheduling), so only the whole is bounded by the wall time.
        assert sum(step["kernel_ms"] for step in steps) <= sum(step["wall_ms"] for step in steps)
        for step in steps:
            assert step["cuda_graph_batch"] == (None if eager else batch)  # buckets 1, 2, 3
            assert step["kernel_ms"] > 0 and step["launches"] > 0
            if not eager:  # one graph launch runs every kernel of the forward
                assert step["launches"] < step["kernels"]
        assert not any(k["name"].startswith("aten::") for k in summary["top_kernels"])
