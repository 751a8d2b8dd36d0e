"""Paged attention on the Llama-3-8B head layout (32 query heads, 8 kv heads, head dim 128), bf16.

Decode: batch 1 and 64, contexts 512..8192, with split-K chosen by default and with one split.
Each decode time comes from a CUDA graph that cycles several caches, so the 50 MB L2 cannot hold
the keys and values; GB/s counts the keys and values read once, and the fraction is of the
device's measured copy bandwidth. Prefill: one 2048-token chunk, alone and over a 2048-token
cached prefix, and eight 512-token prompts, in causal TFLOP/s; the prompts without a prefix also
through torch's own FlashAttention (`varlen_attn` over the step's fresh keys and values, and
`scaled_dot_product_attention` for the single chunk), the speed a prefill path must match.

    .venv/bin/python -m pagoda_runtime.bench.attention_kernels
"""

from __future__ import annotations

import math

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.varlen import varlen_attn

from pagoda_runtime.bench.roofline import copy_bandwidth
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels.triton_paged_attention import max_splits, paged_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
SCALE = HEAD_DIM**-0.5
STREAM_BYTES = 256 * 2**20


def make_batch(query_lens: list[int], context_lens: list[int]):
    """A random bf16 cache whose blocks are scattered, q for the new tokens, and the metadata."""
    blocks = [math.ceil(c / BLOCK_SIZE) for c in context_lens]
    order = torch.randperm(sum(blocks), device="cuda", dtype=torch.int32)
    tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int32, device="cuda")
    offset = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[offset : offset + n]
        offset += n
    cache = torch.randn(2, sum(blocks), BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(sum(query_lens), HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    starts = torch.tensor([0, *query_lens], device="cuda").cumsum(0).to(torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64, device="cuda"),
        query_start_loc=starts,
        seq_lens=torch.tensor(context_lens, dtype=torch.int32, device="cuda"),
        block_tables=tables,
        max_query_len=max(query_lens),
        max_seq_len=max(context_lens),
    )
    return q, cache, meta


def decode_seconds(batch: int, context: int, num_splits: int | None) -> float:
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
    copies = max(1, math.ceil(STREAM_BYTES / kv_bytes))
    batches = [make_batch([1] * batch, [context] * batch) for _ in range(copies)]
    for q, cache, meta in batches:
        paged_attention(q, cache, meta, SCALE, num_splits)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for q, cache, meta in batches:
            paged_attention(q, cache, meta, SCALE, num_splits)
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    return ms / 1e3 / copies


def causal_flops(chunks: list[int], prefix: int) -> int:
    """The matmul flops of causal attention for each chunk over a cached prefix (QK and PV)."""
    return sum(4 * HEADS * HEAD_DIM * sum(prefix + i + 1 for i in range(chunk)) for chunk in chunks)


def prefill_seconds(chunks: list[int], prefix: int) -> float:
    """Median seconds of causal chunks, each over a cached prefix, through the paged kernel."""
    q, cache, meta = make_batch(chunks, [prefix + chunk for chunk in chunks])
    ms = triton.testing.do_bench(lambda: paged_attention(q, cache, meta, SCALE), return_mode="median")
    return ms / 1e3


def torch_prefill_seconds(chunks: list[int]) -> dict[str, float | str]:
    """Median seconds of the same fresh prompts through torch's FlashAttention entry points; a
    variant this torch or GPU cannot run is reported with its error instead."""
    tokens = sum(chunks)
    q = torch.randn(tokens, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(tokens, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    starts = torch.tensor([0, *chunks], device="cuda").cumsum(0).to(torch.int32)
    group = HEADS // KV_HEADS
    # varlen_attn documents keys with the query's head count, so the kv heads are repeated for it.
    k_all, v_all = (x.repeat_interleave(group, dim=1) for x in (k, v))
    longest = max(chunks)
    variants = {
        "varlen_attn": lambda: varlen_attn(
            q, k_all, v_all, starts, starts, longest, longest, scale=SCALE, window_size=(-1, 0)
        ),
    }
    if len(chunks) == 1:
        q4, k4, v4 = (x.transpose(0, 1)[None] for x in (q, k, v))
        variants["sdpa (flash, GQA)"] = lambda: torch.nn.functional.scaled_dot_product_attention(
            q4, k4, v4, is_causal=True, scale=SCALE, enable_gqa=True
        )
    seconds: dict[str, float | str] = {}
    for name, fn in variants.items():
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                seconds[name] = triton.testing.do_bench(fn, return_mode="median") / 1e3
        except Exception as error:  # an entry point this build lacks is a finding, not a crash
            seconds[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return seconds


def main() -> None:
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print("batch context splits        us    GB/s of copy | 1 split us    GB/s")
    for batch in (1, 64):
        for context in (512, 1024, 2048, 4096, 8192):
            kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
            splits = max_splits(batch, KV_HEADS, torch.device("cuda"))
            t = decode_seconds(batch, context, None)
            t1 = decode_seconds(batch, context, 1)
            print(
                f"{batch:>5} {context:>7} {splits:>6} {t * 1e6:>9.1f} {kv_bytes / t / 1e9:>7.0f} "
                f"{kv_bytes / t / bandwidth:>7.0%} | {t1 * 1e6:>10.1f} {kv_bytes / t1 / 1e9:>7.0f}"
            )
    for chunks, prefix in (([2048], 0), ([2048], 2048), ([512] * 8, 0)):
        flops = causal_flops(chunks, prefix)
        seconds = prefill_seconds(chunks, prefix)
        label = f"prefill {len(chunks)} x {chunks[0]} over prefix {prefix}"
        print(f"{label}: paged kernel {seconds * 1e6:.0f} us, {flops / seconds / 1e12:.0f} TFLOP/s")
        if prefix == 0:
            for name, result in torch_prefill_seconds(chunks).items():
                if isinstance(result, str):
                    print(f"{label}: {name} could not run: {result}")
                else:
                    print(
                        f"{label}: {name} {result * 1e6:.0f} us, {flops / result / 1e12:.0f} TFLOP/s "
                        f"(the paged kernel takes {seconds / result:.2f}x its time)"
                    )


if __name__ == "__main__":
    main()
