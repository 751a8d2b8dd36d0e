"""The tables of BENCHMARKS.md: for each, the JSON results it is written from and its columns.

To add a table: commit the benchmark's JSON under benchmarks/results/, add a `Table` here, and put
`<!-- table: NAME -->` and `<!-- /table -->` where it belongs in BENCHMARKS.md; then run
`python -m benchmarks.report` (report.py) to write it.
"""

from __future__ import annotations

from benchmarks.table_spec import Column, Table

MIB = 2**20


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}"


def percentiles(stats: dict, keys: tuple[str, ...], scale=ms) -> str:
    """'p50 / p95 / p99' of a bench serve percentile dict, each through `scale`."""
    return " / ".join(scale(stats[k]) for k in keys)


def seconds(value: float) -> str:
    return f"{value:.1f}"


def _quality_rows(loaded: list[dict]) -> list[dict]:
    (result,) = loaded
    return result["rows"]


def _against_reference(key: str, fmt: str):
    """A comparison with the reference: empty in the reference's own row."""
    return lambda row: fmt.format(row[key]) if key in row else ""


def _weights(row: dict) -> str:
    return f"{row['weight_bytes'] / MIB:.1f} ({row['predicted_weight_bytes'] / MIB:.1f})"


def micros(value: float) -> str:
    """A duration given in microseconds, in µs below a millisecond and in ms above."""
    return f"{value:.2g} µs" if value < 10 else f"{value:.0f} µs" if value < 1000 else f"{value / 1e3:.2g} ms"


def _host_part(part: str):
    """One part of a step profile's host time (host_parts_ms_median), in ms."""
    return lambda row: f"{row['host_parts_ms_median'][part]:.2f} ms"


def _waited_on_ms(row: dict) -> float:
    """The host time a step's device waits on: all of it but what ran while a step was in flight."""
    parts = row["host_parts_ms_median"]
    return parts["schedule"] + parts["prepare"] + parts["output"]


def _step_parts(row: dict) -> dict[str, float]:
    """A step profile's host parts in ms, from either format of its JSON: before async scheduling
    the tokens' appending and their text were one part (`output`, and `overlapped` when made
    while the next step ran)."""
    parts = row["host_parts_ms_median"]
    if "output" in parts:
        tokens = parts["output"] + parts["overlapped"]
        host = parts["schedule"] + parts["prepare"] + tokens
        waited = parts["schedule"] + parts["prepare"] + parts["output"]
    else:
        tokens, host = parts["append"] + parts["sample"] + parts["emit"], parts["host"]
        waited = 0.0 if row["async_scheduling"] else host
    return {
        "schedule": parts["schedule"],
        "prepare": parts["prepare"],
        "tokens": tokens,
        "host": host,
        "waited": waited,
    }


def _waited_on(row: dict) -> str:
    if row.get("async_scheduling"):
        return "none, while the device's step is longer"
    return f"**{_step_parts(row)['waited']:.2f} ms**"


def _mask_rows(loaded: list[dict]) -> list[dict]:
    (result,) = loaded
    return sorted(result["steps"], key=lambda r: (r["constrained"] > 0, r["constrained"], r["batch"]))


def _engine_rows(loaded: list[dict]) -> list[dict]:
    (result,) = loaded
    rows = [{"engine": f"llguidance {result['llguidance']}", **result["llguidance_engine"]}]
    if "xgrammar_engine" in result:
        xgrammar = result["xgrammar_engine"]
        rows.append({"engine": f"xgrammar {xgrammar['version']}", **xgrammar})
    return rows


def _refused(row: dict) -> str:
    refused = [key for key, status in row["coverage"].items() if status.startswith("refused")]
    return ", ".join(refused) if refused else "none"


def _vs_llamacpp_run(result: dict) -> str:
    time = result["date"].split(" ", 1)[1]
    return f"{time} ({result['load_average_before'][0]:.1f})"


def _profile_parts(row: dict, *labels: str) -> str:
    return f"{sum(row['parts_ms'][label] for label in labels):.1f}"


def _rotary_and_kv_write(row: dict) -> tuple[str, ...]:
    """Their labels: one since they are one op, two in the results committed before."""
    return ("rotary_write_kv",) if "rotary_write_kv" in row["parts_ms"] else ("rotary", "write_kv")


def _rss_mib(row: dict) -> str:
    return f"{row['llamacpp']['peak_rss_mib']:,.0f} / {row['pagoda']['peak_rss_mib']:,.0f} MiB"


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def _cold_start_rows(loaded: list[dict]) -> list[dict]:
    """The cold-start benchmark's one JSON, as (what, result) rows."""
    (result,) = loaded
    hub, minio = result["download"]["hf_mirror"], result["download"]["s3_minio"]
    synthetic, bundled = result["load"]["synthetic"], result["load"]["bundled"]
    replica = result["second_replica_scheduled_to_engine_s"]
    rest = synthetic["process_to_engine_s"] - synthetic["import_s"] - synthetic["weights_s"]
    return [
        {
            "what": "fetch from the hub mirror (huggingface_hub, 4 workers, sha256 checked)",
            "result": f"{hub['seconds']:.1f} s, {hub['mb_per_s']:.0f} MB/s",
        },
        {
            "what": "fetch from MinIO (MinIO client, MD5 ETags checked)",
            "result": f"{minio['seconds']:.1f} s, {minio['mb_per_s']:.0f} MB/s",
        },
        {
            "what": f"start-up of the synthetic {_gb(result['checkpoint']['bytes'])} checkpoint "
            "(process start to engine ready)",
            "result": f"{synthetic['process_to_engine_s']:.1f} s: {synthetic['import_s']:.1f} s imports, "
            f"{synthetic['weights_s']:.1f} s weights ({synthetic['weights_gb_per_s']:.2f} GB/s), "
            f"{rest:.1f} s the rest",
        },
        {
            "what": "anonymous memory the load added, synthetic",
            "result": f"{_gb(synthetic['load_rss_anon_growth_bytes'])} for {_gb(synthetic['weight_bytes'])} "
            f"of weights and a {synthetic['kv_cache_bytes'] / MIB:.0f} MiB KV cache",
        },
        {
            "what": "start-up of the bundled SmolLM2-135M (GGUF Q4_1 dequantized to float32)",
            "result": f"{bundled['process_to_engine_s']:.1f} s: {bundled['import_s']:.1f} s imports, "
            f"{bundled['weights_s']:.1f} s weights "
            f"({_gb(bundled['weight_bytes'])} of float32 from GGUF blocks)",
        },
        {
            "what": "second replica, scheduled → engine ready, with the cache",
            "result": f"{replica['with_cache']:.1f} s (its own start-up only)",
        },
        {
            "what": "second replica, scheduled → engine ready, without it (its own download first)",
            "result": f"{replica['without_cache_hf_mirror']:.1f} s from the hub mirror, "
            f"{replica['without_cache_s3_minio']:.1f} s from MinIO",
        },
    ]


def _cold_start_node_rows(loaded: list[dict]) -> list[dict]:
    """The real-node cold start: a second replica with the cache and without, side by side."""
    (result,) = loaded
    cached, own = result["second_replica"]["with_cache"], result["second_replica"]["without_cache"]

    def runs(summary: dict, key: str) -> str:
        return ", ".join(f"{r[key]:.1f}" for r in summary["runs"]) + " s"

    def loads(summary: dict) -> str:
        return ", ".join(f"{load:.1f}" for load in summary["load_average_1m"])

    return [
        {
            "what": f"second replica, scheduled → serving (/health/ready polled every 0.2 s; "
            f"median of {len(cached['runs'])})",
            "with": f"{cached['median_scheduled_to_serving_s']:.1f} s",
            "without": f"{own['median_scheduled_to_serving_s']:.1f} s",
        },
        {
            "what": "each run",
            "with": runs(cached, "scheduled_to_serving_s"),
            "without": runs(own, "scheduled_to_serving_s"),
        },
        {
            "what": f"second replica, scheduled → Ready condition (startup probe every "
            f"{result['startup_probe_period_s']} s; median)",
            "with": f"{cached['median_scheduled_to_ready_s']:.0f} s",
            "without": f"{own['median_scheduled_to_ready_s']:.0f} s",
        },
        {
            "what": "each run",
            "with": runs(cached, "scheduled_to_ready_s"),
            "without": runs(own, "scheduled_to_ready_s"),
        },
        {
            "what": "its init container (median)",
            "with": f"{cached['median_init_container_s']:.0f} s ({cached['runs'][0]['init_container']})",
            "without": f"{own['median_init_container_s']:.0f} s ({own['runs'][0]['init_container']}: "
            f"{_gb(result['model']['bytes'])})",
        },
        {
            "what": "its runtime, container started → Ready condition (median)",
            "with": f"{cached['median_runtime_started_to_ready_s']:.0f} s",
            "without": f"{own['median_runtime_started_to_ready_s']:.0f} s",
        },
        {
            "what": "filling the cache, once (the download Job)",
            "with": f"{result['cache_fill']['job_s']:.0f} s",
            "without": "-",
        },
        {
            "what": "host load average (1 min) at each run",
            "with": loads(cached),
            "without": loads(own),
        },
    ]


SERVE_RATES = ("0.1", "0.25", "0.5", "1")


def _compile_rows(loaded: list[dict]) -> list[dict]:
    """hopper_compile.py's reports before and after, paired by launch (a launch made only after,
    such as the bf16 batch-1 kernel, has no before)."""
    # The commit before also launched a merge kernel after a split decode: BENCHMARKS.md names it.
    before, after = (
        {r["launch"]: r for r in result["reports"] if r["kernel"] != "_merge_splits_kernel"}
        for result in loaded
    )
    return [
        {"launch": launch, "before": before.get(launch), "after": report} for launch, report in after.items()
    ]


def _compile_cell(fmt):
    """'before -> after' of one report figure, or the after alone."""

    def cell(row: dict) -> str:
        after = fmt(row["after"])
        return after if row["before"] is None else f"{fmt(row['before'])} → {after}"

    return cell


def _kernel_name(report: dict) -> str:
    return report["kernel"].strip("_").removesuffix("_kernel")


def _per_weight(report: dict) -> str:
    return f"{report['instructions_per_weight']:.2f}" if "instructions_per_weight" in report else "-"


def _p50_p95(phase: dict) -> str:
    return f"{phase['ttft_p50_ms']:,.0f} / {phase['ttft_p95_ms']:,.0f}"


def _loaded_over_idle(row: dict) -> str:
    return f"{row['loaded_over_idle_p50']:.2f}x, **{row['loaded_over_idle_p95']:.2f}x**"


def _priority_rows(loaded: list[dict]) -> list[dict]:
    """priority_ttft.py's runs, one row per policy, with the step budget each server ran with."""
    return [
        {
            **result,
            "max_num_batched_tokens": run["settings"].get("max_num_batched_tokens", 8192),
            "interactive_prompt": run["settings"]["interactive_prompt"],
        }
        for run in loaded
        for result in run["results"]
    ]


TABLES = [
    Table(
        "serving-cpu",
        tuple(f"cpu/serve-rate-{rate}.json" for rate in SERVE_RATES),
        (
            Column("rate (req/s)", lambda r: f"{r['config']['request_rate']:g}"),
            Column("completed", lambda r: f"{r['completed']} / {r['config']['num_prompts']}"),
            Column("output tok/s", lambda r: f"{r['output_throughput']:.1f}"),
            Column("TTFT p50 / p95 / p99 (ms)", lambda r: percentiles(r["ttft_s"], ("p50", "p95", "p99"))),
            Column("TPOT p50 / p95 / p99 (ms)", lambda r: percentiles(r["tpot_s"], ("p50", "p95", "p99"))),
            Column("ITL p50 / p95 / p99 (ms)", lambda r: percentiles(r["itl_s"], ("p50", "p95", "p99"))),
            Column("E2E p50 / p95 (s)", lambda r: percentiles(r["e2e_s"], ("p50", "p95"), seconds)),
        ),
    ),
    Table(
        "batch-sweep-cpu",
        ("cpu/throughput_vs_batch.json",),
        (
            Column("batch", lambda r: str(r["batch"])),
            Column("Pagoda decode tok/s", lambda r: f"{r['decode_tok_per_s']:.1f}"),
            Column("Pagoda tok/s, prefill included", lambda r: f"{r['output_tok_per_s']:.1f}"),
            Column("transformers tok/s, prefill included", lambda r: f"{r['hf_output_tok_per_s']:.1f}"),
            Column("ratio", lambda r: f"{r['output_tok_per_s'] / r['hf_output_tok_per_s']:.2f}x"),
        ),
        rows=lambda loaded: loaded[0]["rows"],
    ),
    Table(
        "mixed-lengths-cpu",
        ("cpu/throughput_mixed.json",),
        (
            Column("requests", lambda r: str(r["workload"]["num_prompts"])),
            Column("prompt and output lengths", lambda r: "{}-{}".format(*r["workload"]["lengths"])),
            Column("Pagoda output tok/s", lambda r: f"{r['results']['output_tok_per_s']:.1f}"),
            Column("transformers output tok/s", lambda r: f"{r['results']['hf_output_tok_per_s']:.1f}"),
            Column("ratio", lambda r: f"**{r['results']['speedup_vs_hf']:.2f}x**"),
        ),
    ),
    Table(
        "quant-quality-cpu",
        ("cpu/quant_quality.json",),
        (
            Column("variant", lambda r: r["variant"]),
            Column("perplexity", lambda r: f"{r['perplexity']:.2f}"),
            Column("vs reference", _against_reference("perplexity_vs_reference", "{:+.1%}")),
            Column("top-1 agreement", _against_reference("top1_agreement", "{:.1%}")),
            Column("mean KL (nats)", _against_reference("mean_kl", "{:.4f}")),
            Column("weights MiB (sizing)", _weights),
            Column("KV bytes/block", lambda r: str(r["kv_bytes_per_block"])),
        ),
        rows=_quality_rows,
    ),
    Table(
        "structured-mask-cpu",
        ("cpu/structured_output.json",),
        (
            Column("batch", lambda r: str(r["batch"])),
            Column("constrained rows", lambda r: str(r["constrained"])),
            Column(
                "mask per step p50 / p90",
                lambda r: f"{micros(r['mask']['p50_us'])} / {micros(r['mask']['p90_us'])}",
            ),
            Column(
                "feeding the sampled token, all rows, p50", lambda r: micros(r["advance_all_rows"]["p50_us"])
            ),
        ),
        rows=_mask_rows,
    ),
    Table(
        "grammar-engines-cpu",
        ("cpu/structured_output.json",),
        (
            Column("engine", lambda r: r["engine"]),
            Column("compile this schema", lambda r: f"{r['compile_ms']:.0f} ms"),
            Column(
                "mask per token p50 / p90",
                lambda r: (
                    f"{micros(r['mask_per_token']['p50_us'])} / {micros(r['mask_per_token']['p90_us'])}"
                ),
            ),
            Column("schema keywords it refuses by name", _refused),
        ),
        rows=_engine_rows,
    ),
    Table(
        "vs-llamacpp-cpu",
        (
            "cpu/vs_llamacpp_before.json",
            "cpu/vs_llamacpp.json",
            "cpu/vs_llamacpp_idle.json",
            "cpu/vs_llamacpp_fewer_ops.json",
        ),
        (
            Column("run (load at start)", _vs_llamacpp_run),
            Column("Pagoda's projections", lambda r: r["pagoda"]["quantization"]),
            Column("llama.cpp batch 1", lambda r: f"{r['llamacpp']['batch1_decode_tok_s']:.1f} tok/s"),
            Column(
                "Pagoda batch 1",
                lambda r: (
                    f"{r['pagoda']['batch1_decode_tok_s']:.1f} tok/s "
                    f"({r['targets']['batch1_vs_llamacpp']:.2f}x)"
                ),
            ),
            Column(
                "Pagoda batch 8 (aggregate)",
                lambda r: (
                    f"{r['pagoda']['batch8_decode_tok_s']:.1f} tok/s "
                    f"({r['targets']['batch8_vs_llamacpp_batch1']:.2f}x)"
                ),
            ),
            Column(
                "TTFT 512 tokens llama.cpp / Pagoda",
                lambda r: (
                    f"{r['llamacpp']['ttft_s']:.2f} s / {r['pagoda']['ttft_s']:.2f} s "
                    f"({r['targets']['ttft_vs_llamacpp']:.2f}x)"
                ),
            ),
            Column("greedy ids equal to llama.cpp's", lambda r: r["targets"]["greedy_ids_equal_to_llamacpp"]),
            Column("peak RSS llama.cpp / Pagoda", _rss_mib),
        ),
    ),
    Table(
        "decode-profile-cpu",
        tuple(
            f"cpu/decode_profile_{dtype}_b{batch}.json" for batch in (1, 8) for dtype in ("float32", "auto")
        ),
        (
            Column("--dtype (projections)", lambda r: f"{r['dtype']} ({r['quantization']})"),
            Column("batch", lambda r: str(r["batch"])),
            Column("CPU per step (median)", lambda r: f"{r['step_cpu_ms_median']:.1f} ms"),
            Column("profiled step", lambda r: f"{r['profiled_step_ms']:.1f} ms"),
            Column("projections", lambda r: _profile_parts(r, "linear (projections)")),
            Column("lm_head", lambda r: _profile_parts(r, "logits (lm_head)")),
            Column("attention", lambda r: _profile_parts(r, "attention")),
            Column(
                "norms, rotary, KV write, SiLU",
                lambda r: _profile_parts(r, "rms_norm", *_rotary_and_kv_write(r), "silu_and_mul"),
            ),
            Column("ATen calls per layer", lambda r: f"{r['aten_ops_per_layer']:.0f}"),
            Column("load at start", lambda r: f"{r['load_average_before'][0]:.1f}"),
        ),
    ),
    Table(
        "host-time-cpu",
        ("cpu/host_time_before_b256.json", "cpu/host_time_after_b256.json"),
        (
            Column("engine", lambda r: r["engine"]),
            Column("batch", lambda r: str(r["batch"])),
            Column("tokens into the output", lambda r: str(r["decoded"])),
            Column("schedule", _host_part("schedule")),
            Column("batch tensors", _host_part("prepare")),
            Column("outputs", _host_part("output")),
            Column("host per step", lambda r: f"**{_waited_on_ms(r):.2f} ms**"),
            Column("step (wall)", lambda r: f"{r['step_wall_ms_median']:.1f} ms"),
            Column("load at start", lambda r: f"{r['load_average_before'][0]:.1f}"),
        ),
        rows=lambda loaded: [
            {"engine": "whole outputs each step, torch.tensor", **loaded[0]},
            {"engine": "delta outputs, numpy-built tensors", **loaded[1]},
        ],
    ),
    Table(
        "async-output-cpu",
        ("cpu/async_output_off_b256.json", "cpu/async_output_on_b256.json"),
        (
            Column("text made", lambda r: r["order"]),
            Column("batch", lambda r: str(r["batch"])),
            Column("schedule", _host_part("schedule")),
            Column("batch tensors", _host_part("prepare")),
            Column("outputs the device waits on", _host_part("output")),
            Column("outputs while the device runs", _host_part("overlapped")),
            Column("host the device waits on", lambda r: f"**{_waited_on_ms(r):.2f} ms**"),
            Column("load at start", lambda r: f"{r['load_average_before'][0]:.1f}"),
        ),
        rows=lambda loaded: [
            {"order": "before the next launch", **loaded[0]},
            {"order": "while the next step runs (async output processing)", **loaded[1]},
        ],
    ),
    Table(
        "async-scheduling-cpu",
        (
            "cpu/host_overlap_before_in_order_b256.json",
            "cpu/host_overlap_before_async_output_b256.json",
            "cpu/host_overlap_after_in_order_b256.json",
            "cpu/host_overlap_after_async_scheduling_b256.json",
        ),
        (
            Column("engine", lambda r: r["engine"]),
            Column("step order", lambda r: r["order"]),
            Column("schedule", lambda r: f"{_step_parts(r)['schedule']:.2f} ms"),
            Column("batch tensors", lambda r: f"{_step_parts(r)['prepare']:.2f} ms"),
            Column("tokens and text", lambda r: f"{_step_parts(r)['tokens']:.2f} ms"),
            Column("host per step", lambda r: f"{_step_parts(r)['host']:.2f} ms"),
            Column("the device waits on", _waited_on),
            Column("step (wall)", lambda r: f"{r['step_wall_ms_median']:.0f} ms"),
            Column("load at start", lambda r: f"{r['load_average_before'][0]:.1f}"),
        ),
        rows=lambda loaded: [
            {"engine": "before", "order": "in order", **loaded[0]},
            {"engine": "before", "order": "async output processing", **loaded[1]},
            {"engine": "after", "order": "in order", **loaded[2]},
            {"engine": "after", "order": "async scheduling", **loaded[3]},
        ],
    ),
    Table(
        "detokenize-cpu",
        ("cpu/detokenize_before.json", "cpu/detokenize_after.json"),
        (
            Column("detokenizer", lambda r: r["detokenizer"]),
            Column("case", lambda r: r["case"]),
            Column("µs per token", lambda r: f"{r['us_per_token']:.2f}"),
            Column("ms per step at 256 sequences", lambda r: f"**{r['ms_per_step_at_256']:.2f}**"),
        ),
        rows=lambda loaded: [
            {"detokenizer": name, **row}
            for name, result in zip(
                ("stop search at every token", "stop search after a stop's character"), loaded, strict=True
            )
            for row in result["rows"]
        ],
    ),
    Table(
        "step-broadcast-cpu",
        ("cpu/step_broadcast.json",),
        (
            Column("step", lambda r: r["shape"]),
            Column("sent", lambda r: f"{r['payload_bytes'] / 1024:,.1f} KiB"),
            Column("broadcast + one all-reduce (median)", lambda r: micros(r["median_us"])),
            Column("the broadcast's own cost", lambda r: micros(r["overhead_us"])),
        ),
        rows=lambda loaded: loaded[0]["rows"],
    ),
    Table(
        "kernels-compile-sm90",
        ("sm90/compile_before.json", "sm90/compile_after.json"),
        (
            Column("launch (Llama-3-8B shapes)", lambda r: r["launch"]),
            Column("kernel", _compile_cell(_kernel_name)),
            Column("registers", _compile_cell(lambda r: str(r["registers"]))),
            Column("spills (bytes)", _compile_cell(lambda r: str(r["spill_store_bytes"]))),
            Column("blocks / SM", _compile_cell(lambda r: str(r["blocks_per_sm"]))),
            Column("stages", _compile_cell(lambda r: str(r["num_stages"]) if r["pipelined"] else "none")),
            Column("loop instructions", _compile_cell(lambda r: str(r["loop_instructions"]))),
            Column("instructions / weight", _compile_cell(_per_weight)),
        ),
        rows=_compile_rows,
    ),
    Table(
        "cold-start-cpu",
        ("cpu/cold_start.json",),
        (Column("what", lambda r: r["what"]), Column("result", lambda r: r["result"])),
        rows=_cold_start_rows,
    ),
    *(
        Table(
            name,
            (f"cpu/{file}",),
            (
                Column("what", lambda r: r["what"]),
                Column("with the cache", lambda r: r["with"]),
                Column("without it (own download)", lambda r: r["without"]),
            ),
            rows=_cold_start_node_rows,
        )
        for name, file in (
            ("cold-start-node-cpu", "cold_start_node.json"),
            ("cold-start-node-synthetic-cpu", "cold_start_node_synthetic.json"),
        )
    ),
    Table(
        "priority-ttft-cpu",
        ("cpu/priority_ttft.json", "cpu/priority_ttft_chunked.json", "cpu/priority_ttft_chunked_256.json"),
        (
            Column("policy", lambda r: r["policy"]),
            Column("step budget (tokens)", lambda r: str(r["max_num_batched_tokens"])),
            Column("interactive prompt (tokens)", lambda r: str(r["interactive_prompt"])),
            Column("idle TTFT p50 / p95 (ms)", lambda r: _p50_p95(r["idle"])),
            Column("loaded TTFT p50 / p95 (ms)", lambda r: _p50_p95(r["loaded"])),
            Column("loaded / idle p50, p95", _loaded_over_idle),
            Column("interactive requests (idle, loaded)", lambda r: f"{r['idle']['n']}, {r['loaded']['n']}"),
            Column(
                "batch requests done while probing",
                lambda r: f"{r['batch_requests_completed_while_probing']}",
            ),
            Column("preemptions", lambda r: f"{r['preemptions']:.0f}"),
        ),
        rows=_priority_rows,
    ),
]
