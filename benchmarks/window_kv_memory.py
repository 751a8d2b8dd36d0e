"""The KV memory one long prompt holds when sliding-window layers keep only their window, measured by
the engine's block manager while the prompt runs, beside the same model with every layer keeping
every token (its windows switched off).

    python -m benchmarks.window_kv_memory --shape tiny-gemma3 --prompt-len 4096 --result-json FILE
    python -m benchmarks.window_kv_memory --shape gemma-3-12b --prompt-len 32768 --device cuda

Each step, after the scheduler has given the sequence its blocks, the blocks it holds are counted
in each pool (full-attention layers, sliding-window layers); the peak times the bytes of a block in
that pool's layers is the KV the prompt needed. A window layer still holds the whole chunk a
prefill step writes, so the prompt is prefilled in chunks (--max-num-batched-tokens), as a long
prompt is served. Random weights: the figure depends on the shape and
the lengths only.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.model_catalogue import shape_config
from pagoda_runtime.contract.sizing import kv_layer_bytes_per_token
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.window_block_manager import NO_BLOCK
from pagoda_runtime.executor.devices import resolve_placement
from pagoda_runtime.loading.model_source import LoadedModel
from pagoda_runtime.loading.random_model import bare_tokenizer, random_weights


def _held(table: list[int]) -> int:
    return sum(1 for block in table if block != NO_BLOCK)


def measure(
    shape: str, prompt_len: int, device: str, dtype: str, windows: bool, block_size: int, chunk: int
) -> dict:
    config = shape_config(shape)
    if not windows:
        config = replace(
            config, architecture=replace(config.architecture, sliding_window=None, layer_types=())
        )
    arch = config.architecture
    placement = resolve_placement(device, dtype)
    loaded = LoadedModel(
        config,
        random_weights(config, placement.device, placement.dtype),
        bare_tokenizer(arch.vocab_size, f"{shape} (random weights)"),
    )
    engine_config = EngineConfig(
        model=shape,
        device=device,
        dtype=dtype,
        max_model_len=prompt_len + 8,
        max_num_seqs=1,
        max_num_batched_tokens=chunk,
        block_size=block_size,
        enable_prefix_caching=False,
    )
    engine = LLMEngine(engine_config, loaded=loaded)
    manager = engine.block_manager
    peak = {"full": 0, "window": 0}
    append = manager.append

    def counted(seq, num_new):
        append(seq, num_new)
        peak["full"] = max(peak["full"], _held(seq.block_table))
        peak["window"] = max(peak["window"], _held(seq.window_block_table))

    manager.append = counted
    prompt = torch.randint(0, arch.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0))
    engine.add_request(
        "long", prompt.tolist(), SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )
    while engine.has_unfinished():
        engine.step()
    layer_block = block_size * kv_layer_bytes_per_token(arch, engine.runner.kv_cache_dtype_name)
    runner = engine.runner
    sliding = arch.num_sliding_layers if runner.window else 0
    full_layers = arch.num_hidden_layers - sliding
    if runner.pools.full_blocks:
        held = peak["full"] * full_layers + peak["window"] * sliding
    else:  # every layer slides: the one table is the window pool's
        held = peak["full"] * sliding
    return {
        "windows": windows,
        "peak_full_blocks": peak["full"] if runner.pools.full_blocks else 0,
        "peak_window_blocks": peak["window"] if runner.pools.full_blocks else peak["full"],
        "full_layers": full_layers,
        "window_layers": sliding,
        "kv_bytes_held": held * layer_block,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="tiny-gemma3")
    parser.add_argument("--prompt-len", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="the prefill chunk")
    parser.add_argument("--result-json")
    args = parser.parse_args()
    runs = [
        measure(
            args.shape,
            args.prompt_len,
            args.device,
            args.dtype,
            w,
            args.block_size,
            args.max_num_batched_tokens,
        )
        for w in (True, False)
    ]
    with_windows, without = runs
    result = {
        "shape": args.shape,
        "prompt_len": args.prompt_len,
        "device": args.device,
        "block_size": args.block_size,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "runs": runs,
        "saved_fraction": 1 - with_windows["kv_bytes_held"] / without["kv_bytes_held"],
    }
    print(json.dumps(result, indent=2))
    if args.result_json:
        with open(args.result_json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
