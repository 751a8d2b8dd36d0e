"""Batched LoRA in the whole decode step: what serving adapters costs over the base model alone.

A random-weight model of a named shape (Llama-3-8B by default) decodes a batch of requests
(default 32) three ways, each in an engine of its own: the base model without LoRA, then with
LoRA on (--max-loras adapters of --rank on all seven projections, random PEFT folders this script
writes) serving the requests spread evenly over the adapters, and the same LoRA engine serving
every request on the base model (what turning LoRA on costs requests that use none). Each is the
median time of a decode step (every request past its prompt, so every step is batch-wide), the
best of --repeats runs; the overhead is the adapters' step time over the base model's. The issue's
bar: at batch 32 with 4 adapters of rank 16, no more than 15% over the base. --smoke: tiny-llama,
a batch of 4 (a check of this script on the CPU, not a timing).

    .venv/bin/python -m benchmarks.lora_decode [--shape llama-3-8b] [--batch 32] [--max-loras 4]
        [--rank 16] [--smoke] [--result-json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from safetensors.torch import save_file

from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.bench.results import emit
from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.model_catalogue import shape_config
from pagoda_runtime.loading.lora_adapter import CONFIG_FILE, LORA_TARGETS, WEIGHTS_FILE, projection_shape

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_adapter(folder: Path, config: ModelConfig, rank: int, seed: int) -> Path:
    """A random PEFT adapter of `rank` on every projection of every layer of `config`."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.architecture.num_hidden_layers):
        for module in LORA_TARGETS:
            fan_in, fan_out = projection_shape(config, module)
            prefix = f"base_model.model.model.layers.{layer}.{'self_attn' if module in _ATTENTION else 'mlp'}"
            # Small, so that the random model's activations stay finite in bf16.
            tensors[f"{prefix}.{module}.lora_A.weight"] = (
                torch.randn(rank, fan_in, generator=generator) * 0.01
            )
            tensors[f"{prefix}.{module}.lora_B.weight"] = (
                torch.randn(fan_out, rank, generator=generator) * 0.01
            )
    save_file(tensors, folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(
        json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(LORA_TARGETS)})
    )
    return folder


def decode_step_seconds(
    llm: LLM, prompts: list[list[int]], max_tokens: int, loras: list[str | None]
) -> float:
    """The median wall time of the engine's steps once every request has its first token."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add(
            engine.make_request(f"lora-decode-{time.monotonic_ns()}-{i}", prompt, params, lora_name=lora)
        )
    started: set[str] = set()
    while len(started) < len(prompts):
        started.update(o.request_id for o in engine.step())
    steps = []
    while engine.has_unfinished():
        before = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - before)
    # The last steps read what is left in flight and drain the batch: not batch-wide.
    return statistics.median(steps[: max(1, len(steps) - 2)])


def measure(llm: LLM, prompts, max_tokens: int, loras, repeats: int) -> float:
    decode_step_seconds(llm, prompts[:1], 4, loras[:1])  # warm-up: first-call allocations and compiles
    return min(decode_step_seconds(llm, prompts, max_tokens, loras) for _ in range(repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-3-8b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0, help="each engine's KV cache")
    parser.add_argument("--smoke", action="store_true", help="tiny-llama, batch 4: checks this script")
    parser.add_argument("--result-json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.batch, args.input_len, args.output_len, args.repeats = "tiny-llama", 4, 8, 8, 1
        args.kv_cache_gib = 0.0625
    config = shape_config(args.shape)
    generator = torch.Generator().manual_seed(0)
    vocab = config.architecture.vocab_size
    prompts = [
        torch.randint(vocab, (args.input_len,), generator=generator).tolist() for _ in range(args.batch)
    ]
    names = [f"adapter-{i}" for i in range(args.max_loras)]
    engine_args = {
        "load_format": "dummy",
        "max_num_seqs": args.batch,
        "max_model_len": args.input_len + args.output_len + 16,
        "kv_cache_memory": int(args.kv_cache_gib * 2**30),
        "enable_prefix_caching": False,  # every run repeats its prompts: keep it decode
    }
    results = {}
    base = LLM(args.shape, **engine_args)
    results["base_step_s"] = measure(base, prompts, args.output_len, [None] * args.batch, args.repeats)
    device = str(base.engine.runner.device)
    del base
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        lora = LLM(
            args.shape, enable_lora=True, max_loras=args.max_loras, max_lora_rank=args.rank, **engine_args
        )
        for i, name in enumerate(names):
            lora.add_lora(name, str(write_adapter(Path(tmp) / name, config, args.rank, seed=i)))
        spread = [names[i % len(names)] for i in range(args.batch)]
        results["adapters_step_s"] = measure(lora, prompts, args.output_len, spread, args.repeats)
        results["lora_on_base_requests_step_s"] = measure(
            lora, prompts, args.output_len, [None] * args.batch, args.repeats
        )
    results["adapters_overhead"] = results["adapters_step_s"] / results["base_step_s"] - 1
    results["lora_on_base_requests_overhead"] = (
        results["lora_on_base_requests_step_s"] / results["base_step_s"] - 1
    )
    emit(
        {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "device": torch.cuda.get_device_name()
            if device.startswith("cuda")
            else f"cpu, {os.cpu_count()} cores",
            "load_average": os.getloadavg(),
            "shape": args.shape,
            "batch": args.batch,
            "max_loras": args.max_loras,
            "rank": args.rank,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "repeats": args.repeats,
            "bar": "adapters_overhead <= 0.15 at batch 32, 4 adapters of rank 16",
            **results,
        },
        args.result_json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
