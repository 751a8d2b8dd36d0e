"""Where a decode step's time goes: wall time against kernel time, step by step.

    python -m benchmarks.step_profile --shape llama-3-8b --batch-sizes 1,32,256 \
        --out benchmarks/results/h100
    OMP_NUM_THREADS=1 python -m benchmarks.step_profile --model smollm2-135m --device cpu \
        --batch-sizes 1,8 --input-len 9 --parts --name decode_profile_auto --out benchmarks/results/cpu

Builds one engine: random weights of a named shape (bench/offline.py), or with --model a model the
engine loads (the bundled one, a folder, a .gguf file). For each batch size it brings that many
sequences of --input-len random tokens into decode, runs a few warm-up steps, times --steps steps
unprofiled (wall and process CPU time), then --steps more in one torch.profiler session, each in
a range of its own (an event belongs to the last step that began before it). The device is waited
for only before the first step and after the last, as a server runs: with async scheduling a
step's kernels run while the host works on the next. For each profiled step it reports the wall
time, the kernel time, the idle gap (wall - kernel), the host's own work the engine measured
(scheduling, batch tensors, appending, text: StepTiming.host_s), the launches, and whether the
forward replayed a CUDA graph (the runner's choice); over the steps, the share of the wall time
the device was idle (the first step left out: it starts on an idle device), the kernels that took
the most time and their share.

On CUDA the kernel time is the sum of the device's activities (kernels, copies, memsets) and the
launches are the host's kernel- and graph-launch calls. The CPU has no device: there the kernel
time is the self time of the ATen ops and the launches are the ATen calls made from Python (each
pays the dispatcher). `kernel_time_is` in the JSON says which.

--parts also labels each part of the step (schedule, projections, attention, the LM head, ...) with
profiler ranges around the engine's own functions, removed again afterwards, and reports each
part's host time per step (parts_ms). A CUDA graph replay runs none of those functions: use
--enforce-eager for parts on CUDA.

Writes {out}/{name}_b{N}.json per batch size and prints a table.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from pagoda_runtime.bench import offline
from pagoda_runtime.bench.workload import OFFLINE_ENGINE_FLAGS, OfflineConfig
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.flags import add_flags, from_args
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.stats import StepTiming

WARM_UP_STEPS = 3
STEP_LABEL = "profiled step"
TOP_KERNELS = 10
# The runtime calls that put work on a CUDA device: one per kernel, or one for a whole graph.
LAUNCH_CALLS = ("LaunchKernel", "GraphLaunch")
KERNEL_TIME_IS = {
    "cuda": "CUDA device activity (kernels, copies, memsets); launches are kernel and graph launch calls",
    "cpu": "self CPU time of the ATen ops (no device); launches are the ATen calls made from Python",
}
# The profiler labels of --parts, in step order; the indented ones run inside "decoder layers (all)".
PARTS = (
    "schedule",
    "prepare batch tensors",
    "embedding",
    "decoder layers (all)",
    "rms_norm",
    "linear (projections)",
    "rotary_write_kv",
    "attention",
    "silu_and_mul",
    "final norm",
    "logits (lm_head)",
    "sampler",
)
INSIDE_LAYERS = PARTS[4:9]


def build(args: argparse.Namespace, max_num_seqs: int, max_model_len: int) -> LLMEngine:
    config = from_args(
        EngineConfig,
        args,
        model=args.model or args.shape,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=False,  # random prompts share nothing
    )
    if args.model:
        return LLMEngine(config)
    return offline.build_engine(OfflineConfig(config), max_model_len)


def decode_steps_before(decoded: int) -> int:
    """Steps each sequence decodes before the measured ones: `decoded`, at least WARM_UP_STEPS."""
    return max(WARM_UP_STEPS, decoded)


def into_decode(
    engine: LLMEngine, batch: int, input_len: int, max_tokens: int, decoded: int = 0, detokenize: bool = False
) -> None:
    """`batch` sequences, all past their prompt and decoding together, each
    decode_steps_before(decoded) tokens into its output."""
    workload = offline.fixed_workload(
        batch, input_len, max_tokens, engine.model_config.architecture.vocab_size, seed=0
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=detokenize, output_kind="delta"
    )
    for i, prompt in enumerate(workload.prompts):
        engine.add_request(f"profile-{batch}-{i}", prompt, params)
    scheduler = engine.scheduler
    while scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in scheduler.running):
        engine.step()
    for _ in range(decode_steps_before(decoded)):
        engine.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(engine: LLMEngine, steps: int) -> tuple[list[float], list[float], list[StepTiming]]:
    """Wall and process CPU seconds of each of `steps` unprofiled steps, and the engine's own timing."""
    device = engine.runner.device
    wall, cpu, timings = [], [], []
    _sync(device)
    for i in range(steps):
        w, c = time.perf_counter(), time.process_time()
        engine.step()
        if i == steps - 1:
            _sync(device)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
        timings.append(engine.last_step_timing)
    return wall, cpu, timings


def _is_aten(event) -> bool:
    return event.device_type == DeviceType.CPU and event.name.startswith("aten::")


def _called_from_python(event) -> bool:
    return _is_aten(event) and not (event.cpu_parent and event.cpu_parent.name.startswith("aten::"))


def kernels_of(events, device_type: str) -> list[tuple[str, float]]:
    """(name, microseconds) of each kernel among `events`."""
    if device_type == "cuda":
        # A record_function range shows on the device's timeline too; it is no kernel.
        device = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
        return [(e.name, e.time_range.elapsed_us()) for e in device]
    return [(e.name, e.self_cpu_time_total) for e in events if _is_aten(e)]


def launches_of(events, device_type: str) -> int:
    if device_type == "cuda":
        return sum(
            1 for e in events if e.device_type == DeviceType.CPU and any(c in e.name for c in LAUNCH_CALLS)
        )
    return sum(1 for e in events if _called_from_python(e))


def by_step(events, steps: int) -> list[list]:
    """The session's events, each with the profiled step it belongs to: the last one that began
    before it (a kernel may end after its step's range, never start before it)."""
    starts = sorted(
        e.time_range.start for e in events if e.name == STEP_LABEL and e.device_type == DeviceType.CPU
    )
    if len(starts) != steps:
        raise RuntimeError(f"the profiler recorded {len(starts)} of the {steps} profiled steps")
    grouped: list[list] = [[] for _ in range(steps)]
    for e in events:
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i >= 0 and e.name != STEP_LABEL:
            grouped[i].append(e)
    return grouped


def profiled_steps(engine: LLMEngine, steps: int) -> list[tuple[dict, list[tuple[str, float]], dict]]:
    """`steps` steps in one profiler session, each in a range of its own: per step its figures, its
    kernels, and the microseconds of each part labelled by labelled_parts (none without it)."""
    device = engine.runner.device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    measured = []
    _sync(device)
    # acc_events only keeps torch from warning that a session's cycles drop events: it has one.
    with profile(activities=activities, acc_events=True) as prof:
        for i in range(steps):
            with record_function(STEP_LABEL):
                started = time.perf_counter()
                engine.step()
                if i == steps - 1:
                    _sync(device)
                wall_ms = (time.perf_counter() - started) * 1e3
            measured.append((wall_ms, engine.last_step_timing, engine.runner.last_graph_batch))
    results = []
    for i, (events, (wall_ms, timing, graph_batch)) in enumerate(
        zip(by_step(prof.events(), steps), measured, strict=True)
    ):
        kernels = kernels_of(events, device.type)
        if not kernels:
            raise RuntimeError(
                f"the profiler recorded no kernel in profiled step {i}: it cannot see the device here "
                "(on CUDA, check that torch.profiler shows kernels outside this tool)"
            )
        kernel_ms = sum(us for _, us in kernels) / 1e3
        figures = {
            "num_seqs": timing.num_seqs,
            "wall_ms": wall_ms,
            "kernel_ms": kernel_ms,
            "idle_gap_ms": wall_ms - kernel_ms,
            "host_ms": timing.host_s * 1e3,
            "launches": launches_of(events, device.type),
            "kernels": len(kernels),
            "aten_calls_from_python": sum(1 for e in events if _called_from_python(e)),
            "cuda_graph_batch": graph_batch,
        }
        part_us: dict[str, float] = defaultdict(float)
        for e in events:
            if e.name in PARTS and e.device_type == DeviceType.CPU:
                part_us[e.name] += e.cpu_time_total
        results.append((figures, kernels, part_us))
    return results


def top_kernels(kernels: list[tuple[str, float]], steps: int) -> list[dict]:
    total_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for name, us in kernels:
        total_us[name] += us
        calls[name] += 1
    everything = sum(total_us.values()) or 1.0
    ranked = sorted(total_us, key=total_us.get, reverse=True)[:TOP_KERNELS]
    return [
        {
            "name": name,
            "ms_per_step": total_us[name] / 1e3 / steps,
            "share": total_us[name] / everything,
            "calls_per_step": calls[name] / steps,
        }
        for name in ranked
    ]


def profile_batch(engine: LLMEngine, batch: int, args: argparse.Namespace) -> dict:
    """Every figure of one batch size; the engine is left empty again."""
    load_before = os.getloadavg()
    into_decode(
        engine, batch, args.input_len, _tokens_needed(args.steps, args.decoded), args.decoded, args.detokenize
    )
    wall, cpu, timings = timed_steps(engine, args.steps)
    steps, kernels, part_us = [], [], defaultdict(float)
    with labelled_parts(engine) if args.parts else nullcontext():
        profiled = profiled_steps(engine, args.steps)
    for figures, step_kernels, step_parts in profiled:
        steps.append(figures)
        kernels.extend(step_kernels)
        for name, us in step_parts.items():
            part_us[name] += us
    for request_id in list(engine.requests):
        engine.abort(request_id)
    device = engine.runner.device
    num_layers = engine.model_config.architecture.num_hidden_layers
    aten_calls = statistics.median(s["aten_calls_from_python"] for s in steps)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_before": load_before,
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": args.model or args.shape,
        "random_weights": not args.model,
        "dtype": args.dtype,
        "model_dtype": str(engine.runner.dtype).removeprefix("torch."),
        "quantization": engine.memory.quantization,
        "batch": batch,
        "input_len": args.input_len,
        "decoded": decode_steps_before(args.decoded),
        "steps": args.steps,
        "torch_threads": torch.get_num_threads(),
        "kernel_time_is": KERNEL_TIME_IS[device.type],
        "step_wall_ms_median": statistics.median(wall) * 1e3,
        "step_cpu_ms_median": statistics.median(cpu) * 1e3,
        "profiled_step_ms": statistics.median(s["wall_ms"] for s in steps),
        **{
            f"{key}_median": statistics.median(s[key] for s in steps)
            for key in ("kernel_ms", "idle_gap_ms", "host_ms")
        },
        # The device's idle share over the profiled steps but the first, which starts on an idle device.
        "device_idle_share": 1
        - sum(s["kernel_ms"] for s in steps[1:]) / sum(s["wall_ms"] for s in steps[1:]),
        # The host's parts of the unprofiled steps (StepTiming), the profiler's overhead left out.
        "host_parts_ms_median": {
            part: statistics.median(getattr(t, f"{part}_s") for t in timings) * 1e3
            for part in ("schedule", "prepare", "launch", "wait", "append", "sample", "emit", "host")
        },
        "async_scheduling": engine.async_scheduling,
        "detokenize": args.detokenize,
        "launches_per_step": statistics.median(s["launches"] for s in steps),
        "kernels_per_step": statistics.median(s["kernels"] for s in steps),
        "aten_ops_per_step": aten_calls,
        "aten_ops_per_layer": aten_calls / num_layers,
        "cuda_graph_steps": sum(1 for s in steps if s["cuda_graph_batch"] is not None),
        "top_kernels": top_kernels(kernels, args.steps),
        "steps_profiled": steps,
    }
    if args.parts:
        summary["parts_ms"] = {name: part_us[name] / 1e3 / args.steps for name in PARTS}
    return summary


def _tokens_needed(steps: int, decoded: int) -> int:
    # The prefill's token, the warm-up steps, the timed and the profiled ones, and a margin.
    return 1 + decode_steps_before(decoded) + 2 * steps + 4


def _labelled(label: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapper


@contextmanager
def labelled_parts(engine: LLMEngine) -> Iterator[None]:
    """Wrap every part of a step in a profiler label (PARTS); the originals come back on exit."""

    undo: list[Callable[[], None]] = []

    def wrap(owner, name: str, label: str) -> None:
        own = vars(owner)
        if name in own:
            original = own[name]
            undo.append(lambda: setattr(owner, name, original))
        else:  # a method of the class, shadowed on this instance
            undo.append(lambda: delattr(owner, name))
        setattr(owner, name, _labelled(label, getattr(owner, name)))

    runner = engine.runner
    model = runner.model
    wrap(engine.scheduler, "schedule", "schedule")
    wrap(runner, "_prepare", "prepare batch tensors")
    wrap(model.embed_tokens, "forward", "embedding")
    for layer in model.layers:
        wrap(layer, "forward", "decoder layers (all)")
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            wrap(norm, "forward", "rms_norm")
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            wrap(proj, "forward", "linear (projections)")
        ops = attn.ops
        undo.append(lambda attn=attn, ops=ops: setattr(attn, "ops", ops))
        attn.ops = type(ops)(
            **{name: _labelled(name, getattr(ops, name)) for name in ops.__dataclass_fields__}
        )
    wrap(model.norm, "forward", "final norm")
    wrap(model, "compute_logits", "logits (lm_head)")
    wrap(type(runner.sampler), "__call__", "sampler")  # Python looks special methods up on the class
    for layer in model.layers:
        # The gated MLP holds its activation (GatedMLP.act_and_mul), bound when it was built.
        if hasattr(layer.mlp, "act_and_mul"):
            wrap(layer.mlp, "act_and_mul", "silu_and_mul")
    try:
        yield
    finally:
        for restore in reversed(undo):
            restore()


def print_summary(summary: dict) -> None:
    print(
        f"{summary['model']} ({summary['quantization']}, {summary['model_dtype']}) on {summary['device']}, "
        f"batch {summary['batch']}, {summary['steps']} steps; kernel time: {summary['kernel_time_is']}"
    )
    print(
        f"  unprofiled: {summary['step_wall_ms_median']:.2f} ms wall, "
        f"{summary['step_cpu_ms_median']:.2f} ms process CPU per step (median)"
    )
    print("  step   wall ms  kernel ms  idle gap ms  host ms  launches  kernels  CUDA graph")
    for i, s in enumerate(summary["steps_profiled"]):
        graph = f"batch {s['cuda_graph_batch']}" if s["cuda_graph_batch"] is not None else "no (eager)"
        print(
            f"  {i:>4}  {s['wall_ms']:8.2f}  {s['kernel_ms']:9.2f}  {s['idle_gap_ms']:11.2f}  "
            f"{s['host_ms']:7.2f}  {s['launches']:8d}  {s['kernels']:7d}  {graph}"
        )
    print("  top kernels: ms per step, share of kernel time, calls per step")
    for k in summary["top_kernels"]:
        share, calls = 100 * k["share"], k["calls_per_step"]
        print(f"    {k['ms_per_step']:8.3f}  {share:5.1f}%  {calls:6.0f}  {k['name'][:90]}")
    if "parts_ms" in summary:
        print("  parts (host time per step):")
        step_ms = summary["profiled_step_ms"]
        for label, part_ms in summary["parts_ms"].items():
            indent = "  " if label in INSIDE_LAYERS else ""
            print(f"    {indent}{label:<26}{part_ms:8.2f} ms  {100 * part_ms / step_ms:5.1f}%")


def _sizes(text: str) -> list[int]:
    sizes = [int(b) for b in text.split(",")]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--shape", help="random weights of this named shape (model_catalogue.SHAPES)")
    source.add_argument("--model", help="a model the engine loads: smollm2-135m, a folder or a .gguf file")
    parser.add_argument("--batch-sizes", type=_sizes, default=[1, 32, 256])
    # The engine flags of the offline benchmarks but the batch, which --batch-sizes sets; a CPU
    # overlaps nothing with --async-scheduling, but the step's host parts split the same way.
    add_flags(parser, EngineConfig, set(OFFLINE_ENGINE_FLAGS) - {"max_num_seqs"})
    parser.add_argument(
        "--detokenize", action="store_true", help="stream text as a served request does (default: ids only)"
    )
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument(
        "--decoded",
        type=int,
        default=0,
        help="tokens each sequence decodes before the measured steps (host work per step grows with them)",
    )
    parser.add_argument("--steps", type=int, default=20, help="steps timed, then as many profiled")
    parser.add_argument("--parts", action="store_true", help="each part of the step's host time")
    parser.add_argument("--name", help="file name before _b{N}.json (default: step_profile_MODEL_QUANT)")
    parser.add_argument("--out", required=True, help="folder for the JSON files")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = build(
        args, max(args.batch_sizes), args.input_len + _tokens_needed(args.steps, args.decoded) + 16
    )
    model = Path(args.model).name.removesuffix(".gguf") if args.model else args.shape
    name = args.name or f"step_profile_{model}_{engine.memory.quantization}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for batch in args.batch_sizes:
        summary = profile_batch(engine, batch, args)
        print_summary(summary)
        path = out / f"{name}_b{batch}.json"
        path.write_text(json.dumps(summary, indent=2))
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
