"""Paged attention on the Llama-3-8B head layout (32 query heads, 8 kv heads, head dim 128), bf16.

Decode: batch 1 and 64, contexts 128..8192, with the splits the kernel chooses (up to the batch's
maximum, one per 256 keys of context) and with one split, and at batch 64 over an fp8 cache.
Verify (speculative decoding's step: 5 queries a sequence, K = 4): batch 1 and 4 over 1k to 8k
contexts, with the splits the kernel now chooses and with one split, as it ran before it treated
short queries as decode. Each decode or verify time comes from a CUDA graph that cycles several
caches, so the 50 MB L2 cannot hold the keys and values; GB/s counts the keys and values read
once, and the fraction is of the device's measured copy bandwidth. Prefill: one 2048-token chunk,
alone and over a 2048-token cached prefix, and eight 512-token prompts, in causal TFLOP/s; the
prompts without a prefix also through torch's own FlashAttention (`varlen_attn` over the step's
fresh keys and values, and `scaled_dot_product_attention` for the single chunk), the speed a
prefill path must match. Latent decode: DeepSeek-V3's absorbed attention on one of 8 tensor-parallel
ranks (16 query heads over one 576-wide bf16 latent plane, its keys and its values) at batch 1 and
64 over 1k and 4k contexts, timed as decode is, its GB/s counting the plane read once.

    .venv/bin/python -m benchmarks.attention_kernels [--result-json PATH] [--smoke]

--smoke: tiny batches on whatever device there is (Triton's interpreter on a CPU), to check the
command line.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.varlen import varlen_attn

from pagoda_runtime.bench.roofline import copy_bandwidth
from pagoda_runtime.contract.model_catalogue import MODELS
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels.reference import FP8_KV_DTYPE
from pagoda_runtime.executor.kernels.triton_paged_attention import max_splits, paged_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
SCALE = HEAD_DIM**-0.5
STREAM_BYTES = 256 * 2**20
DECODE = {"batches": (1, 64), "contexts": (128, 512, 1024, 2048, 4096, 8192), "fp8_batch": 64}
SMOKE_DECODE = {"batches": (1, 2), "contexts": (300,), "fp8_batch": 2}
VERIFY = {"batches": (1, 4), "contexts": (1024, 4096, 8192), "query_len": 5}
SMOKE_VERIFY = {"batches": (1,), "contexts": (300,), "query_len": 5}
PREFILL = (([2048], 0), ([2048], 2048), ([512] * 8, 0))
SMOKE_PREFILL = (([24], 0), ([16], 16))
# DeepSeek-V3 served absorbed, on one of 8 tensor-parallel ranks: 128 / 8 query heads over one KV
# head whose single plane holds the 512-wide latent and the 64-wide rotated key.
_V3 = MODELS["deepseek-v3"]
_V3_CACHE = _V3.architecture.kv_cache_shape
LATENT_HEADS = _V3.architecture.num_attention_heads // 8
LATENT_CACHE = {"planes": _V3_CACHE.planes, "kv_heads": _V3_CACHE.heads, "head_dim": _V3_CACHE.head_dim}
LATENT_SCALE = _V3.attention_scale
LATENT_DECODE = {"batches": (1, 64), "contexts": (1024, 4096)}
SMOKE_LATENT_DECODE = {"batches": (1, 2), "contexts": (300,)}
LATENT_WHAT = (
    f"DeepSeek-V3 absorbed, one of 8 TP ranks: {LATENT_HEADS} query heads over one "
    f"{LATENT_CACHE['head_dim']}-wide bf16 latent plane read as keys and as values; GB/s counts the "
    "plane read once"
)


def kv_bytes(
    batch: int, context: int, kv_dtype, planes: int = 2, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM
) -> int:
    """The cache a step over these contexts reads at the least: each plane once."""
    return planes * batch * context * kv_heads * head_dim * kv_dtype.itemsize


def make_batch(
    query_lens: list[int],
    context_lens: list[int],
    device: torch.device,
    kv_dtype=torch.bfloat16,
    *,
    heads: int = HEADS,
    planes: int = 2,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
):
    """A random cache of `planes` planes (keys and values, or one read as both) whose blocks are
    scattered, q for the new tokens, and the metadata."""
    blocks = [math.ceil(c / BLOCK_SIZE) for c in context_lens]
    order = torch.randperm(sum(blocks), device=device, dtype=torch.int32)
    tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int32, device=device)
    offset = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[offset : offset + n]
        offset += n
    cache = torch.randn(planes, sum(blocks), BLOCK_SIZE, kv_heads, head_dim, device=device).to(kv_dtype)
    q = torch.randn(sum(query_lens), heads, head_dim, dtype=torch.bfloat16, device=device)
    starts = torch.tensor([0, *query_lens], device=device).cumsum(0).to(torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64, device=device),
        query_start_loc=starts,
        seq_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=tables,
        max_query_len=max(query_lens),
        max_seq_len=max(context_lens),
    )
    return q, cache, meta


def _bench(fn, **kwargs) -> float:
    """Median milliseconds of fn() on the GPU. triton is imported here, after pagoda_runtime's
    kernels: on a CPU they and triton's own library must both be decorated for the interpreter."""
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median", **kwargs)


def _seconds(fn, device: torch.device) -> float:
    """Median seconds of fn() (a CPU runs the kernels in Triton's interpreter: one call)."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return _bench(fn) / 1e3


def decode_seconds(
    batch: int,
    context: int,
    num_splits: int | None,
    device: torch.device,
    kv_dtype,
    query_len: int = 1,
    *,
    scale: float = SCALE,
    heads: int = HEADS,
    **cache,
) -> float:
    """Median seconds of one step; `cache`: make_batch's planes, kv_heads and head_dim."""
    read = kv_bytes(batch, context, kv_dtype, **cache)
    copies = max(1, math.ceil(STREAM_BYTES / read)) if device.type == "cuda" else 1
    batches = [
        make_batch([query_len] * batch, [context] * batch, device, kv_dtype, heads=heads, **cache)
        for _ in range(copies)
    ]
    for q, kv_cache, meta in batches:
        paged_attention(q, kv_cache, meta, scale, num_splits=num_splits)
    if device.type != "cuda":
        return _seconds(lambda: paged_attention(*batches[0], scale, num_splits=num_splits), device)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for q, kv_cache, meta in batches:
            paged_attention(q, kv_cache, meta, scale, num_splits=num_splits)
    ms = _bench(graph.replay, warmup=25, rep=200)
    return ms / 1e3 / copies


def causal_flops(chunks: list[int], prefix: int) -> int:
    """The matmul flops of causal attention for each chunk over a cached prefix (QK and PV)."""
    return sum(4 * HEADS * HEAD_DIM * sum(prefix + i + 1 for i in range(chunk)) for chunk in chunks)


def prefill_seconds(chunks: list[int], prefix: int, device: torch.device) -> float:
    """Median seconds of causal chunks, each over a cached prefix, through the paged kernel."""
    q, cache, meta = make_batch(chunks, [prefix + chunk for chunk in chunks], device)
    return _seconds(lambda: paged_attention(q, cache, meta, SCALE), device)


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
                seconds[name] = _bench(fn) / 1e3
        except Exception as error:  # an entry point this build lacks is a finding, not a crash
            seconds[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return seconds


def decode_rows(device: torch.device, bandwidth: float, plan: dict) -> list[dict]:
    rows = []
    cases = [(b, c, torch.bfloat16) for b in plan["batches"] for c in plan["contexts"]]
    cases += [(plan["fp8_batch"], c, FP8_KV_DTYPE) for c in plan["contexts"]]
    for batch, context, kv_dtype in cases:
        read = kv_bytes(batch, context, kv_dtype)
        splits = max_splits(batch, KV_HEADS, device)
        t = decode_seconds(batch, context, None, device, kv_dtype)
        t1 = decode_seconds(batch, context, 1, device, kv_dtype)
        rows.append(
            {
                "batch": batch,
                "context": context,
                "cache": "fp8" if kv_dtype == FP8_KV_DTYPE else "bf16",
                "max_splits": splits,
                "seconds": t,
                "GBps": read / t / 1e9,
                "fraction_of_copy": read / t / bandwidth,
                "one_split_seconds": t1,
                "one_split_GBps": read / t1 / 1e9,
            }
        )
    return rows


def verify_rows(device: torch.device, bandwidth: float, plan: dict) -> list[dict]:
    rows = []
    for batch in plan["batches"]:
        for context in plan["contexts"]:
            read = kv_bytes(batch, context, torch.bfloat16)
            t = decode_seconds(batch, context, None, device, torch.bfloat16, plan["query_len"])
            t1 = decode_seconds(batch, context, 1, device, torch.bfloat16, plan["query_len"])
            rows.append(
                {
                    "batch": batch,
                    "context": context,
                    "query_len": plan["query_len"],
                    "max_splits": max_splits(batch, KV_HEADS, device),
                    "seconds": t,
                    "fraction_of_copy": read / t / bandwidth,
                    "one_split_seconds": t1,
                    "speedup_over_one_split": t1 / t,
                }
            )
    return rows


def latent_decode_rows(device: torch.device, bandwidth: float, plan: dict) -> list[dict]:
    rows = []
    for batch in plan["batches"]:
        for context in plan["contexts"]:
            # A kernel that read the plane once as keys and again as values would show under 50%.
            read = kv_bytes(batch, context, torch.bfloat16, **LATENT_CACHE)
            t = decode_seconds(
                batch,
                context,
                None,
                device,
                torch.bfloat16,
                scale=LATENT_SCALE,
                heads=LATENT_HEADS,
                **LATENT_CACHE,
            )
            rows.append(
                {
                    "batch": batch,
                    "context": context,
                    "max_splits": max_splits(batch, LATENT_CACHE["kv_heads"], device),
                    "seconds": t,
                    "GBps": read / t / 1e9,
                    "fraction_of_copy": read / t / bandwidth,
                }
            )
    return rows


def prefill_rows(device: torch.device, plan) -> list[dict]:
    rows = []
    for chunks, prefix in plan:
        flops = causal_flops(chunks, prefix)
        seconds = prefill_seconds(chunks, prefix, device)
        row = {"chunks": chunks, "prefix": prefix, "seconds": seconds, "TFLOPs": flops / seconds / 1e12}
        if prefix == 0 and device.type == "cuda":
            row["torch"] = torch_prefill_seconds(chunks)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result-json", help="also write the figures here")
    parser.add_argument("--smoke", action="store_true", help="tiny batches on any device")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bandwidth = copy_bandwidth(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {name}; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    decode = decode_rows(device, bandwidth, SMOKE_DECODE if args.smoke else DECODE)
    print("batch context cache splits        us    GB/s of copy | 1 split us    GB/s")
    for r in decode:
        shape = f"{r['batch']:>5} {r['context']:>7} {r['cache']:>5} {r['max_splits']:>6}"
        split = f"{r['seconds'] * 1e6:>9.1f} {r['GBps']:>7.0f} {r['fraction_of_copy']:>7.0%}"
        one = f"{r['one_split_seconds'] * 1e6:>10.1f} {r['one_split_GBps']:>7.0f}"
        print(f"{shape} {split} | {one}")
    verify = verify_rows(device, bandwidth, SMOKE_VERIFY if args.smoke else VERIFY)
    for r in verify:
        print(
            f"verify batch {r['batch']} context {r['context']} x{r['query_len']}: "
            f"{r['seconds'] * 1e6:.1f} us "
            f"({r['fraction_of_copy']:.0%} of copy), one split {r['one_split_seconds'] * 1e6:.1f} us"
        )
    latent = latent_decode_rows(device, bandwidth, SMOKE_LATENT_DECODE if args.smoke else LATENT_DECODE)
    for r in latent:
        print(
            f"latent decode batch {r['batch']} context {r['context']} splits {r['max_splits']}: "
            f"{r['seconds'] * 1e6:.1f} us, {r['GBps']:.0f} GB/s ({r['fraction_of_copy']:.0%} of copy)"
        )
    prefill = prefill_rows(device, SMOKE_PREFILL if args.smoke else PREFILL)
    for r in prefill:
        label = f"prefill {len(r['chunks'])} x {r['chunks'][0]} over prefix {r['prefix']}"
        print(f"{label}: paged kernel {r['seconds'] * 1e6:.0f} us, {r['TFLOPs']:.0f} TFLOP/s")
        for variant, result in r.get("torch", {}).items():
            if isinstance(result, str):
                print(f"{label}: {variant} could not run: {result}")
            else:
                ratio = r["seconds"] / result
                print(
                    f"{label}: {variant} {result * 1e6:.0f} us (the paged kernel takes {ratio:.2f}x its time)"
                )
    if args.result_json:
        result = {
            "shape": "tiny" if args.smoke else "llama-3-8b",
            "device": name,
            "copy_bandwidth_GBps": bandwidth / 1e9,
            "decode": decode,
            "verify": verify,
            "prefill": prefill,
            "latent_decode": {"what": LATENT_WHAT, "rows": latent},
        }
        Path(args.result_json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
