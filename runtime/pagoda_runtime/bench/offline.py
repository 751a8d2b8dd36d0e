"""`pagoda-runtime bench throughput|latency`: the engine on a random-weight model of a named shape.

throughput: nano-vllm's fixed workload (by default 256 requests, prompt and output lengths uniform
in 100-1024, ignore_eos, sampled at temperature 0.6 as nano-vllm samples), all submitted at once;
output tokens per second, and the host's share of each engine step (scheduling, batch
preparation, output handling) at the largest batch.
latency: a batch of identical-length greedy requests; TTFT, TPOT and ITL percentiles, and the
batch-1 decode bound (copy bandwidth over the bytes one decode step reads of the model as built).
Both measure the device's copy bandwidth and matmul peak in the same run and report the run's own
roofline (roofline.py): each engine step's bound, the larger of its bytes over the bandwidth and
its FLOPs over the peak, summed over the run's steps; `fraction_of_roofline` is that sum over the
measured seconds.
With --hf, Hugging Face transformers' `generate` (static batches) runs the same shape on the same
device: for throughput, the first --hf-num-prompts requests of the workload (all of them when it
equals --num-prompts) at the same temperature; the report names the requests and how the ratio is
formed.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from pagoda_runtime.bench import hf_baseline, roofline
from pagoda_runtime.bench.stats import percentiles
from pagoda_runtime.bench.workload import OfflineConfig, Workload
from pagoda_runtime.contract.model_catalogue import shape_config
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.stats import StepShape
from pagoda_runtime.executor.devices import resolve_device, resolve_dtype
from pagoda_runtime.loading.random_model import random_model


@dataclass
class Report:
    shape: str
    device: str
    dtype: str
    quantization: str
    kv_cache_dtype: str
    workload: dict
    results: dict = field(default_factory=dict)

    def print(self) -> None:
        print(
            f"shape {self.shape} on {self.device} ({self.dtype}, quantization {self.quantization}, "
            f"KV cache {self.kv_cache_dtype}); workload {self.workload}"
        )
        for key, value in self.results.items():
            if isinstance(value, dict):
                print(f"{key:<36}" + "  ".join(f"{k} {_number(v)}" for k, v in value.items()))
            else:
                print(f"{key:<36}{_number(value)}")


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def nano_vllm_workload(num_prompts: int, min_len: int, max_len: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    lens = [rng.randint(min_len, max_len) for _ in range(num_prompts)]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lens]
    return Workload(prompts, [rng.randint(min_len, max_len) for _ in range(num_prompts)])


def fixed_workload(batch: int, input_len: int, output_len: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(batch)]
    return Workload(prompts, [output_len] * batch)


def build_engine(config: OfflineConfig, max_model_len: int) -> LLMEngine:
    engine_config = replace(
        config.engine,
        max_model_len=max_model_len,
        enable_prefix_caching=False,  # random prompts share nothing; keep the hashing cost out
    )
    device = resolve_device(engine_config.device)
    dtype = resolve_dtype(engine_config.dtype, device)
    return LLMEngine(engine_config, random_model(config.shape, device, dtype, engine_config.seed))


@dataclass
class _Trace:
    token_times: dict[str, list[float]] = field(default_factory=dict)
    arrival: float = 0.0
    host_fractions: list[float] = field(default_factory=list)
    shapes: list[StepShape] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(times) for times in self.token_times.values())


def submit(engine: LLMEngine, workload: Workload, temperature: float) -> list[str]:
    """Queue every request of the workload (ignore_eos: each runs to its output length); their ids."""
    ids = []
    for i, (prompt, out_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        params = SamplingParams(
            max_tokens=out_len,
            temperature=temperature,
            ignore_eos=True,
            detokenize=False,
            output_kind="delta",
        )
        engine.add_request(f"bench-{i}", prompt, params)
        ids.append(f"bench-{i}")
    return ids


def _run(
    engine: LLMEngine, workload: Workload, max_batch: int, temperature: float = 0.0
) -> tuple[float, _Trace]:
    """Submit every request at once and step until all finish; seconds, per-token times and each
    step's shape."""
    trace = _Trace()
    trace.token_times = {request_id: [] for request_id in submit(engine, workload, temperature)}
    _sync(engine)
    trace.arrival = start = time.perf_counter()
    previous = engine.last_step_timing
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        timing = engine.last_step_timing
        if timing is not previous:  # a step that ran a batch (an empty one leaves the last timing)
            previous = timing
            trace.shapes.append(timing.shape)
            if timing.num_seqs >= max_batch:
                trace.host_fractions.append(timing.host_fraction)
        for output in outputs:
            trace.token_times[output.request_id].append(now)
    return time.perf_counter() - start, trace


def _sync(engine: LLMEngine) -> None:
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize(engine.runner.device)


def _warm_up(engine: LLMEngine, vocab: int, temperature: float = 0.0) -> None:
    """Compile the kernels (Triton, prefill shapes, the sampler's path) outside the timed run."""
    warm = fixed_workload(4, min(64, engine.max_model_len - 8), 8, vocab, seed=1)
    _run(engine, warm, 4, temperature)


def _roofline_results(engine: LLMEngine, hardware: roofline.Hardware, trace: _Trace, seconds: float) -> dict:
    costs = roofline.model_costs(engine.runner)
    bound = roofline.roofline(trace.shapes, costs, hardware)
    return {
        **hardware.as_results(),
        "decode_weight_bytes": costs.weight_bytes,
        "roofline_tok_per_s_batch1": roofline.batch1_tok_per_s(costs, hardware),
        **bound.as_results(seconds),
    }


def throughput(
    config: OfflineConfig,
    num_prompts: int,
    min_len: int,
    max_len: int,
    hf_prompts: int,
    hf_batch: int,
    temperature: float = 0.6,
) -> Report:
    """hf_prompts: how many of the workload's requests, from the first, the transformers run covers."""
    if config.hf and not 1 <= hf_prompts <= num_prompts:
        raise ValueError(
            f"--hf-num-prompts {hf_prompts} is not a part of the workload's {num_prompts} requests; "
            f"give 1 to {num_prompts} (all of them compares the same requests)"
        )
    model_config = shape_config(config.shape)
    engine_config = config.engine
    workload = nano_vllm_workload(
        num_prompts, min_len, max_len, model_config.architecture.vocab_size, engine_config.seed
    )
    device = resolve_device(engine_config.device)
    dtype = resolve_dtype(engine_config.dtype, device)
    report = Report(
        config.shape,
        str(device),
        str(dtype),
        engine_config.quantization,
        engine_config.kv_cache_dtype,
        {
            "kind": "throughput",
            "num_prompts": num_prompts,
            "lengths": [min_len, max_len],
            "temperature": temperature,
            "max_num_seqs": engine_config.max_num_seqs,
            "max_num_batched_tokens": engine_config.max_num_batched_tokens,
        },
    )
    if config.hf:
        report.workload |= {"hf_num_prompts": hf_prompts, "hf_batch_size": hf_batch}
    hardware = roofline.measure(device, dtype)
    hf_run = None
    if config.hf:
        hf_run = hf_baseline.throughput(config, workload, hf_prompts, hf_batch, temperature)
    engine = build_engine(config, 2 * max_len)
    report.results["async_scheduling"] = engine.async_scheduling
    _warm_up(engine, model_config.architecture.vocab_size, temperature)
    seconds, trace = _run(engine, workload, engine_config.max_num_seqs, temperature)
    out_tokens = trace.num_tokens
    in_tokens = sum(len(p) for p in workload.prompts)
    report.results.update(
        {
            "duration_s": seconds,
            "output_tokens": out_tokens,
            "output_tok_per_s": out_tokens / seconds,
            "total_tok_per_s": (in_tokens + out_tokens) / seconds,
            "requests_per_s": num_prompts / seconds,
            "kv_cache_blocks": engine.runner.num_blocks,
            "preemptions": engine.scheduler.num_preemptions,
            **_roofline_results(engine, hardware, trace, seconds),
        }
    )
    if trace.host_fractions:
        report.results["host_share_of_step_at_max_batch"] = percentiles(trace.host_fractions)
    if hf_run is not None:
        report.results["hf_output_tokens"] = hf_run.output_tokens
        report.results["hf_duration_s"] = hf_run.seconds
        report.results["hf_output_tok_per_s"] = hf_run.output_tok_per_s
        report.results["speedup_vs_hf"] = out_tokens / seconds / hf_run.output_tok_per_s
        same = "the same requests" if hf_prompts == num_prompts else f"its first {hf_prompts} only"
        report.results["speedup_vs_hf_formed_as"] = (
            f"Pagoda's output tok/s over all {num_prompts} requests / transformers' output tok/s over "
            f"{same}, in static batches of {hf_batch} (each request's own output tokens, not the "
            "padding steps of its batch)"
        )
    return report


def latency(config: OfflineConfig, batch: int, input_len: int, output_len: int) -> Report:
    model_config = shape_config(config.shape)
    engine_config = config.engine
    workload = fixed_workload(
        batch, input_len, output_len, model_config.architecture.vocab_size, engine_config.seed
    )
    device = resolve_device(engine_config.device)
    dtype = resolve_dtype(engine_config.dtype, device)
    report = Report(
        config.shape,
        str(device),
        str(dtype),
        engine_config.quantization,
        engine_config.kv_cache_dtype,
        {
            "kind": "latency",
            "batch": batch,
            "input_len": input_len,
            "output_len": output_len,
        },
    )
    hardware = roofline.measure(device, dtype)
    hf_rate = hf_baseline.latency(config, workload) if config.hf else None
    engine = build_engine(config, input_len + output_len + 16)
    report.results["async_scheduling"] = engine.async_scheduling
    _warm_up(engine, model_config.architecture.vocab_size)
    seconds, trace = _run(engine, workload, batch)
    ttft = [times[0] - trace.arrival for times in trace.token_times.values()]
    gaps = [b - a for times in trace.token_times.values() for a, b in zip(times, times[1:], strict=False)]
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in trace.token_times.values() if len(t) > 1]
    decode_rate = batch / percentiles(tpot)["p50"] if tpot else 0.0
    report.results.update(
        {
            "duration_s": seconds,
            "output_tokens": trace.num_tokens,
            "output_tok_per_s": trace.num_tokens / seconds,
            "decode_tok_per_s": decode_rate,
            "ttft_s": percentiles(ttft),
            "tpot_s": percentiles(tpot),
            "itl_s": percentiles(gaps),
            **_roofline_results(engine, hardware, trace, seconds),
        }
    )
    if batch == 1:
        bound = report.results["roofline_tok_per_s_batch1"]
        report.results["decode_fraction_of_roofline_batch1"] = decode_rate / bound
    if hf_rate is not None:
        report.results["hf_output_tok_per_s"] = hf_rate
        report.results["speedup_vs_hf"] = trace.num_tokens / seconds / hf_rate
        report.results["speedup_vs_hf_formed_as"] = (
            f"output tok/s, prefill included, of the same {batch} requests on each side"
        )
    return report


def finish(report: Report, result_json: str | None) -> int:
    report.print()
    if result_json:
        with open(result_json, "w") as f:
            json.dump(asdict(report), f, indent=2)
    return 0
