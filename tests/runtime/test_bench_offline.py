"""`pagoda-runtime bench throughput|latency` run end to end on a tiny random model on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from pagoda_runtime.bench.offline import nano_vllm_workload
from pagoda_runtime.contract.model_catalogue import SHAPES, shape_config
from pagoda_runtime.loading.random_model import random_model

SWEEPS = ["-m", "benchmarks.sweeps"]


def _bench(tmp_path, *args: str) -> dict:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagoda_runtime.cli",
            "bench",
            *args,
            "--shape",
            "tiny-llama",
            "--device",
            "cpu",
            "--result-json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "output_tok_per_s" in proc.stdout
    return json.loads(out.read_text())


def test_throughput_generates_every_requested_token_and_compares_with_transformers(tmp_path):
    report = _bench(
        tmp_path,
        "throughput",
        "--num-prompts",
        "6",
        "--min-len",
        "8",
        "--max-len",
        "24",
        "--max-num-seqs",
        "4",
        "--hf",
        "--hf-num-prompts",
        "4",
        "--hf-batch-size",
        "2",
    )
    results = report["results"]
    workload = nano_vllm_workload(6, 8, 24, shape_config("tiny-llama").architecture.vocab_size, seed=0)
    assert results["output_tokens"] == sum(workload.output_lens)
    assert results["output_tok_per_s"] == pytest.approx(results["output_tokens"] / results["duration_s"])
    assert results["speedup_vs_hf"] == pytest.approx(
        results["output_tok_per_s"] / results["hf_output_tok_per_s"]
    )
    # The transformers run: the first 4 requests, their own output tokens only.
    assert report["workload"]["hf_num_prompts"] == 4 and report["workload"]["hf_batch_size"] == 2
    assert results["hf_output_tokens"] == sum(workload.output_lens[:4])
    assert "first 4" in results["speedup_vs_hf_formed_as"]
    assert report["workload"]["temperature"] == 0.6
    assert 0 < results["host_share_of_step_at_max_batch"]["p50"] <= 1
    _check_roofline(results)


def _check_roofline(results: dict) -> None:
    """The run's roofline is positive, below the measured time, and no step beats streaming the
    weights once at the measured bandwidth."""
    assert 0 < results["fraction_of_roofline"] < 1
    assert results["fraction_of_roofline"] == pytest.approx(results["roofline_s"] / results["duration_s"])
    weights_s = results["decode_weight_bytes"] / (results["copy_bandwidth_GBps"] * 1e9)
    assert results["roofline_s"] >= results["roofline_steps"] * weights_s
    assert results["roofline_tok_per_s_batch1"] == pytest.approx(1 / weights_s)
    assert 0 <= results["roofline_memory_bound_steps"] <= results["roofline_steps"]
    assert results["matmul_peak_TFLOPs"] > 0


def test_latency_reports_per_token_percentiles(tmp_path):
    report = _bench(tmp_path, "latency", "--batch-size", "2", "--input-len", "10", "--output-len", "6")
    results = report["results"]
    assert report["workload"] == {"kind": "latency", "batch": 2, "input_len": 10, "output_len": 6}
    assert (report["quantization"], report["kv_cache_dtype"]) == ("none", "auto")
    assert results["async_scheduling"] is False  # a CPU has nothing to overlap
    assert results["output_tokens"] == 12
    ttft, tpot = results["ttft_s"], results["tpot_s"]
    assert 0 < ttft["p50"] <= ttft["p99"] < results["duration_s"]
    assert 0 < tpot["p50"] < results["duration_s"]
    _check_roofline(results)
    # Two prefills in one step, then one step per decode token for both.
    assert results["roofline_steps"] == 6
    assert "decode_fraction_of_roofline_batch1" not in results  # a batch-1 figure only


def test_workload_is_fixed_by_its_seed_and_within_bounds():
    a = nano_vllm_workload(50, 100, 1024, 1000, seed=0)
    assert a == nano_vllm_workload(50, 100, 1024, 1000, seed=0)
    assert a != nano_vllm_workload(50, 100, 1024, 1000, seed=1)
    assert all(100 <= len(p) <= 1024 for p in a.prompts) and all(100 <= n <= 1024 for n in a.output_lens)
    assert all(0 <= t < 1000 for p in a.prompts for t in p)


def test_every_named_shape_yields_the_weights_its_config_implies():
    model = random_model("tiny-llama", torch.device("cpu"), torch.float32)
    names = dict(model.weights)
    assert names["model.norm.weight"].eq(1).all()
    assert names["lm_head.weight"].shape == (512, 64)
    assert {"llama-3-8b", "llama-3.2-1b", "qwen2.5-7b"} <= set(SHAPES)
    with pytest.raises(ValueError, match="unknown model shape 'llama-9'"):
        shape_config("llama-9")


@pytest.mark.parametrize("shape", ["llama-3-8b", "llama-3.2-1b", "qwen2.5-7b"])
def test_transformers_baseline_rotates_positions_like_the_engine(shape):
    # A baseline without Llama 3.2's rope scaling would be a different model, not an anchor.
    from pagoda_runtime.bench.hf_baseline import hf_config
    from pagoda_runtime.executor.kernels.rope_cache import _inverse_frequencies
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = shape_config(shape)
    hf = hf_config(config)
    rope_type = hf.rope_parameters["rope_type"]
    if rope_type == "default":
        expected = 1.0 / (hf.rope_parameters["rope_theta"] ** (torch.arange(0, hf.head_dim, 2) / hf.head_dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    assert rope_type == ("llama3" if config.rope_scaling else "default")
    torch.testing.assert_close(
        _inverse_frequencies(config.rope_theta, config.rotary_dim, config.rope_scaling).float(),
        expected.float(),
    )


def test_batch_sweep_writes_a_table_and_a_plot_per_batch_size(tmp_path):
    command = [sys.executable, *SWEEPS, "batch", "--shape", "tiny-llama", "--device", "cpu"]
    command += [
        "--batch-sizes",
        "1,4",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--hf",
        "--out",
        str(tmp_path),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    table = json.loads((tmp_path / "throughput_vs_batch.json").read_text())
    assert [row["batch"] for row in table["rows"]] == [1, 4]
    for row in table["rows"]:
        assert row["decode_tok_per_s"] > 0 and row["output_tok_per_s"] > 0 and row["hf_output_tok_per_s"] > 0
    assert (tmp_path / "throughput_vs_batch.png").read_bytes().startswith(b"\x89PNG")


def test_quant_sweep_compares_each_variant_with_the_first_and_records_what_cannot_run(tmp_path):
    from benchmarks import sweeps

    command = ["quant", "--shape", "tiny-llama", "--device", "cpu", "--quantizations", "none,int8,int4,gptq"]
    assert sweeps.main([*command, "--input-len", "8", "--output-len", "6", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "quantization_speed.json").read_text())
    assert (table["baseline"], table["batch"]) == ("none", 1)
    none, int8, int4, gptq = table["rows"]
    assert [r["quantization"] for r in table["rows"]] == ["none", "int8", "int4", "gptq"]
    assert none["speedup"] == 1.0
    for row in (int8, int4):
        assert row["speedup"] == pytest.approx(row["decode_tok_per_s"] / none["decode_tok_per_s"])
    for row in (none, int8, int4):  # bench latency's roofline figures, as it reports them
        assert row["copy_bandwidth_GBps"] > 0 and row["matmul_peak_TFLOPs"] > 0
        assert row["fraction_of_roofline"] > 0 and row["decode_fraction_of_roofline_batch1"] > 0
    assert none["decode_weight_bytes"] > int8["decode_weight_bytes"] > int4["decode_weight_bytes"]
    # Random float weights hold no GPTQ blocks: the row says so instead of stopping the sweep.
    assert "no GPTQ blocks" in gptq["skipped"] and gptq["speedup"] is None and "decode_tok_per_s" not in gptq
    assert (tmp_path / "quantization_speed.png").read_bytes().startswith(b"\x89PNG")


def test_quant_sweep_refuses_an_unknown_variant_before_running_any(tmp_path, capsys):
    from benchmarks import sweeps

    with pytest.raises(SystemExit) as exit_info:
        sweeps.main(
            ["quant", "--shape", "tiny-llama", "--quantizations", "none,int3", "--out", str(tmp_path)]
        )
    assert exit_info.value.code == 2
    assert "unknown quantization int3" in capsys.readouterr().err
    assert not (tmp_path / "quantization_speed.json").exists()


@pytest.mark.gpu
def test_quant_sweep_runs_every_weight_quantization_on_cuda(tmp_path):
    import gc

    from benchmarks import sweeps

    command = ["quant", "--shape", "tiny-llama", "--device", "cuda", "--quantizations", "none,int8,fp8,int4"]
    command += ["--kv-cache-memory", str(2**28), "--input-len", "8", "--output-len", "6"]
    command += ["--out", str(tmp_path)]
    assert sweeps.main(command) == 0
    gc.collect()
    torch.cuda.empty_cache()
    table = json.loads((tmp_path / "quantization_speed.json").read_text())
    assert [r["quantization"] for r in table["rows"]] == ["none", "int8", "fp8", "int4"]
    assert all("skipped" not in r and r["decode_tok_per_s"] > 0 for r in table["rows"]), table["rows"]
    assert table["dtype"] == "torch.bfloat16"
