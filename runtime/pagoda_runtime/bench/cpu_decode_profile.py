"""Where one decode step of the bundled model goes on the CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=runtime python -m pagoda_runtime.bench.cpu_decode_profile \
        --batch 1 --steps 20 --dtype auto --json benchmarks/results/cpu/decode_profile_auto_b1.json

Serves the bundled SmolLM2-135M with `LLM(model="smollm2-135m", device="cpu", dtype=--dtype)`
(auto: the Q4_1 projections through torch's packed int4 kernel; float32: the file dequantized to
float32 at load, the exact path), brings `--batch`
sequences of the benchmark prompt into decode, then times `--steps` engine steps twice: plain
(wall and process CPU time per step), and under torch.profiler with each part of the step labelled
(the labels wrap the engine's own functions from here; nothing in the runtime is changed). Prints
each part's share of the profiled step, the number of ATen ops per step and per layer, and the CPU
time inside matrix-multiply kernels; --json writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pagoda_runtime import LLM, SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who"
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int4pack_mm_for_cpu")


def labelled(label: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def label_parts(llm: LLM) -> list[str]:
    """Wrap every part of a step in a profiler label; returns the labels in step order."""
    engine = llm.engine
    runner = engine.runner
    model = runner.model
    engine.scheduler.schedule = labelled("schedule", engine.scheduler.schedule)
    runner._prepare = labelled("prepare batch tensors", runner._prepare)
    model.embed_tokens.forward = labelled("embedding", model.embed_tokens.forward)
    for layer in model.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.forward = labelled("rms_norm", norm.forward)
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            proj.forward = labelled("linear (projections)", proj.forward)
        ops = attn.ops
        attn.ops = type(ops)(
            **{
                **{name: getattr(ops, name) for name in ops.__dataclass_fields__},
                "rotary": labelled("rotary", ops.rotary),
                "write_kv": labelled("write_kv", ops.write_kv),
                "attention": labelled("attention", ops.attention),
            }
        )
        layer.forward = labelled("decoder layers (all)", layer.forward)
    model.norm.forward = labelled("final norm", model.norm.forward)
    model.compute_logits = labelled("logits (lm_head)", model.compute_logits)
    runner.sampler.__class__.__call__ = labelled("sampler", runner.sampler.__class__.__call__)
    import pagoda_runtime.model as model_module

    model_module.silu_and_mul = labelled("silu_and_mul", model_module.silu_and_mul)
    return [
        "schedule",
        "prepare batch tensors",
        "embedding",
        "decoder layers (all)",
        "rms_norm",
        "linear (projections)",
        "rotary",
        "write_kv",
        "attention",
        "silu_and_mul",
        "final norm",
        "logits (lm_head)",
        "sampler",
    ]


def into_decode(llm: LLM, batch: int, max_tokens: int) -> None:
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add(engine.make_request(f"profile-{i}", PROMPT, params))
    while engine.scheduler.waiting or any(
        seq.num_computed_tokens < seq.num_prompt_tokens for seq in engine.scheduler.running
    ):
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--dtype", default="auto", help="auto (packed int4 kernels) or float32 (the exact, dequantized path)"
    )
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args()

    load_before = os.getloadavg()
    llm = LLM("smollm2-135m", device="cpu", dtype=args.dtype)
    num_layers = len(llm.engine.runner.model.layers)
    into_decode(llm, args.batch, max_tokens=2 * args.steps + 16)
    engine = llm.engine
    wall, cpu = [], []
    for _ in range(args.steps):
        w, c = time.perf_counter(), time.process_time()
        engine.step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)

    labels = label_parts(llm)
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("step"):
        for _ in range(args.steps):
            engine.step()
    events = prof.key_averages()
    total = {e.key: e.cpu_time_total / 1e3 / args.steps for e in events}
    step_ms = total["step"]
    # ATen calls made from Python (each pays the dispatcher); calls from inside other ops do not count.
    top_level = sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))
    )
    top_level /= args.steps
    matmul_ms = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1e3 / args.steps
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_before": load_before,
        "dtype": args.dtype,
        "quantization": engine.memory.quantization,
        "batch": args.batch,
        "torch_threads": torch.get_num_threads(),
        "step_wall_ms_median": statistics.median(wall) * 1e3,
        "step_cpu_ms_median": statistics.median(cpu) * 1e3,
        "profiled_step_ms": step_ms,
        "parts_ms": {label: total.get(label, 0.0) for label in labels},
        "aten_ops_per_step": top_level,
        "aten_ops_per_layer": top_level / num_layers,
        "matmul_kernel_ms": matmul_ms,
    }
    print(f"batch {args.batch}, {summary['torch_threads']} threads, {args.steps} decode steps")
    print(
        f"step: {summary['step_wall_ms_median']:.1f} ms wall, {summary['step_cpu_ms_median']:.1f} ms CPU "
        f"(median, unprofiled); {step_ms:.1f} ms profiled"
    )
    for label, ms in summary["parts_ms"].items():
        indent = "  " if label in labels[4:10] else ""
        print(f"  {indent}{label:<26}{ms:8.2f} ms  {100 * ms / step_ms:5.1f}%")
    print(
        f"ATen calls from Python: {top_level:.0f} per step, {top_level / num_layers:.0f} per layer; "
        f"matmul kernels {matmul_ms:.1f} ms ({100 * matmul_ms / step_ms:.0f}%)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
