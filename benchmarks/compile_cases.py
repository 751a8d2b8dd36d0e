"""The kernel launches hopper_compile.py compiles: `test`, small launches of every kernel in every
dtype; `llama`, the launches of a Llama-3-8B decode (and a prefill chunk) on an H100/H200."""

from __future__ import annotations

import torch

from compile_shapes import BLOCK_SIZE, HEAD_DIM, KV_HEADS, LLAMA3_8B_LAYERS, SMS, decode_batch
from pagoda_runtime.executor.kernels import (
    reference,
    triton_lora,
    triton_moe,
    triton_moe_routing,
    triton_paged_attention,
    triton_rmsnorm,
    triton_rotary_kv_write,
    triton_sampling,
    triton_silu_mul,
)
from pagoda_runtime.executor.kernels.lora_slots import lora_batch
from pagoda_runtime.executor.kernels.moe_activation import ClampedSwiGLU
from pagoda_runtime.executor.kernels.moe_options import ExpertOptions
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting
from pagoda_runtime.executor.kernels.moe_weights import PackedExperts
from pagoda_runtime.executor.quantization import dispatch, triton_mma
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8
from pagoda_runtime.executor.quantization.packed import PackedWeight

# Mixture-of-experts layers: (hidden, intermediate, top_k, dtype, expert kinds, batch sizes). The
# batches' pairs per expert pick each default tile shape (1, 24, 100, 300 for bf16).
MOE_LAYERS = {
    "qwen3-30b-a3b": (
        2048,
        768,
        8,
        torch.bfloat16,
        ("float", "int8", "fp8", "int4", "Q4_K_M"),
        (1, 24, 100, 300),
    ),
    "mixtral-8x7b": (4096, 14336, 2, torch.bfloat16, ("float",), (1, 300)),
    "tiny": (64, 32, 2, torch.float32, ("float",), (1, 24)),
}
# LoRA on Llama-3-8B's projections (input width, output parts): three parts, and the long input.
LORA_PROJECTIONS = {"qkv": (4096, (4096, 1024, 1024)), "down": (14336, (4096,))}


def _quantized_weights(n: int, k: int, group: int) -> dict:
    w = torch.randn(n, k) * 0.02
    return {
        "int8": triton_mma.to_mma_layout(quantize_int8(w)),
        "fp8": triton_mma.to_mma_layout(quantize_fp8(w)),
        "int4": triton_mma.to_mma_layout(quantize_int4(w, group)),
    }


def _matmul_cases(shapes, rows_list, dtypes) -> list:
    """Every Triton path the dispatch table routes these shapes and batches to."""
    found = []
    for layer, n, k in shapes:
        weights = _quantized_weights(n, k, 128 if k % 128 == 0 else 32)
        for dtype in dtypes:
            weights["dense"] = triton_mma.dense_mma_weight(torch.randn(n, k, dtype=dtype))
            for (kind, weight), rows in ((item, r) for item in weights.items() for r in rows_list):
                plan = dispatch.route(kind, rows, n, k)
                x = torch.randn(rows, k, dtype=dtype)
                if plan.path == "mma":
                    call = lambda x=x, w=weight, c=plan.config: triton_mma.mma_matmul(x, w, c)  # noqa: E731
                elif kind != "dense":
                    call = lambda w=weight, d=dtype: triton_mma.dequantize_mma(w, d)  # noqa: E731
                else:
                    continue
                label = f"{kind} {layer} rows {rows}" + (f" {dtype}" if len(dtypes) > 1 else "")
                found.append((label, call))
    return found


def _attention_cases(batches) -> list:
    found = []
    for label, (batch, context, query_len, dtype, kv_dtype, splits) in batches.items():
        q, cache, meta = decode_batch(batch, context, dtype, kv_dtype, query_len)
        found.append(
            (
                label,
                lambda q=q, c=cache, m=meta, s=splits: triton_paged_attention.paged_attention(
                    q, c, m, HEAD_DIM**-0.5, num_splits=s
                ),
            )
        )
    return found


def _packed_experts(kind: str, experts: int, n: int, k: int, group: int | None = None) -> PackedExperts:
    """Uninitialized experts of the real layout: only shapes and types reach the compiler. group:
    int4's (128 unless given) or int8's (per channel unless given)."""
    rows = experts * n
    if kind == "int4":
        group = group or 128
        weight = PackedWeight(
            "int4",
            torch.empty(rows, k // 2, dtype=torch.uint8),
            torch.empty(rows, k // group, dtype=torch.float16),
            group,
            torch.empty(rows, k // group, dtype=torch.float16),
        )
    elif kind == "int8":
        group = group or k
        weight = PackedWeight(
            "int8", torch.empty(rows, k, dtype=torch.int8), torch.empty(rows, k // group).half(), group
        )
    else:
        weight = PackedWeight("fp8", torch.empty(rows, k, dtype=torch.float8_e4m3fn), torch.empty(rows, 1), k)
    return PackedExperts(weight, experts)


def _moe_cases() -> list:
    # Only the routed experts' count matters to the compiler; top_k of them keep the weights small.
    found = []
    for model, (hidden, inter, top_k, dtype, kinds, batches) in MOE_LAYERS.items():
        experts = top_k
        for kind in kinds:
            if kind == "float":
                w_gate_up = torch.empty(experts, 2 * inter, hidden, dtype=dtype)
                w_down = torch.empty(experts, hidden, inter, dtype=dtype)
            elif kind == "Q4_K_M":
                # A GGUF file's experts as served: Q4_K gate/up in int4 groups of 32, Q6_K down
                # projections in int8 groups of 16.
                w_gate_up = _packed_experts("int4", experts, 2 * inter, hidden, 32)
                w_down = _packed_experts("int8", experts, hidden, inter, 16)
            else:
                w_gate_up = _packed_experts(kind, experts, 2 * inter, hidden)
                w_down = _packed_experts(kind, experts, hidden, inter)
            for tokens in batches:
                x = torch.randn(tokens, hidden, dtype=dtype)
                logits = torch.randn(tokens, experts)
                found.append(
                    (
                        f"moe {model} {kind} {dtype} tokens {tokens}",
                        lambda x=x, lg=logits, g=w_gate_up, d=w_down, k=top_k: triton_moe.fused_moe(
                            x, lg, g, d, k, True
                        ),
                    )
                )
    return found


def _gpt_oss_moe_cases() -> list:
    # GPT-OSS-20B's experts, which add both biases and use the clamped SwiGLU: bf16 as its MXFP4
    # checkpoint loads, int4 as --quantization int4 serves it (groups of 64 divide its 2880 inputs).
    # 300 tokens over 4 experts take the prefill tiles, which for int4 stop at 64 rows (a 128-row
    # int4 gate_up tile spilled registers at this width).
    hidden = inter = 2880
    experts = top_k = 4
    dtype = torch.bfloat16
    options = ExpertOptions(
        gate_up_bias=torch.empty(experts, 2 * inter, dtype=dtype),
        down_bias=torch.empty(experts, hidden, dtype=dtype),
        activation=ClampedSwiGLU(),
    )
    weights = {
        "float": (
            torch.empty(experts, 2 * inter, hidden, dtype=dtype),
            torch.empty(experts, hidden, inter, dtype=dtype),
            (1, 300),
        ),
        "int4": (
            _packed_experts("int4", experts, 2 * inter, hidden, 64),
            _packed_experts("int4", experts, hidden, inter, 64),
            (1, 100, 300),
        ),
    }
    found = []
    for kind, (w_gate_up, w_down, batches) in weights.items():
        for tokens in batches:
            x = torch.randn(tokens, hidden, dtype=dtype)
            logits = torch.randn(tokens, experts)
            found.append(
                (
                    f"moe gpt-oss-20b {kind} {dtype} tokens {tokens}",
                    lambda x=x, lg=logits, g=w_gate_up, d=w_down: triton_moe.fused_moe(
                        x, lg, g, d, top_k, True, options=options
                    ),
                )
            )
    return found


def _sigmoid_routing_moe_cases() -> list:
    # DeepSeek V3's layer, which routes by sigmoid scores in groups: the routing kernel's [tokens,
    # 256 experts] tile with its group vote. The weights hold top_k experts, but the tiles are the
    # ones 256 experts' pairs per expert pick.
    hidden, inter, experts, top_k = 7168, 2048, 256, 8
    dtype = torch.bfloat16
    routing = SigmoidRouting(num_groups=8, topk_groups=4, routed_scaling_factor=2.5)
    bias = torch.empty(experts)
    w_gate_up = torch.empty(top_k, 2 * inter, hidden, dtype=dtype)
    w_down = torch.empty(top_k, hidden, inter, dtype=dtype)
    found = []
    for tokens in (1, 300):
        x = torch.randn(tokens, hidden, dtype=dtype)
        logits = torch.randn(tokens, experts)
        config = triton_moe.default_moe_config(tokens * top_k, experts, dtype)
        found.append(
            (
                f"moe deepseek-v3 sigmoid routing {dtype} tokens {tokens}",
                lambda x=x, lg=logits, c=config: triton_moe.fused_moe(
                    x,
                    lg,
                    w_gate_up,
                    w_down,
                    top_k,
                    True,
                    c,
                    ExpertOptions(sigmoid_routing=routing, correction_bias=bias),
                ),
            )
        )
    return found


def _lora_cases() -> list:
    # Four adapter slots: a decode batch of rank 16 and a prefill chunk of rank 64.
    found = []
    for name, (in_features, parts) in LORA_PROJECTIONS.items():
        for dtype, tokens, rank in [(torch.bfloat16, 32, 16), (torch.bfloat16, 2048, 64)]:
            x = torch.randn(tokens, in_features, dtype=dtype)
            out = torch.empty(tokens, sum(parts), dtype=dtype)
            lora_a = torch.empty(len(parts), 4, rank, in_features, dtype=dtype)
            lora_b = torch.empty(4, sum(parts), rank, dtype=dtype)
            batch = lora_batch(torch.arange(tokens) % 5 - 1, 4)
            found.append(
                (
                    f"lora {name} {dtype} tokens {tokens} rank {rank}",
                    lambda o=out, x=x, b=batch, a=lora_a, lb=lora_b, p=parts: triton_lora.add_lora(
                        o, x, b, a, lb, torch.ones(4), p
                    ),
                )
            )
    x = torch.randn(5, 64)
    found.append(
        (
            "lora tiny float32 rank 8",
            lambda: triton_lora.add_lora(
                torch.empty(5, 48),
                x,
                lora_batch(torch.arange(5) % 3 - 1, 2),
                torch.empty(1, 2, 8, 64),
                torch.empty(2, 48, 8),
                torch.ones(2),
                (48,),
            ),
        )
    )
    return found


KERNELS = [
    (triton_paged_attention, "_paged_attention_kernel"),
    (triton_rotary_kv_write, "_rotary_kv_write_kernel"),
    (triton_rmsnorm, "_rms_norm_kernel"),
    (triton_silu_mul, "_silu_and_mul_kernel"),
    (triton_sampling, "_sample_kernel"),
    (triton_mma, "_mma_kernel"),
    (triton_mma, "_dequantize_kernel"),
    (triton_moe, "_moe_gemm_kernel"),
    (triton_moe_routing, "_route_kernel"),
    (triton_moe_routing, "_align_kernel"),
    (triton_lora, "_lora_shrink_kernel"),
    (triton_lora, "_lora_expand_kernel"),
]


def _small_cases() -> list:
    found = []
    for dtype in (torch.float32, torch.bfloat16):
        for kv_dtype in (None, reference.FP8_KV_DTYPE):
            found += _attention_cases(
                {
                    f"decode {dtype} cache {kv_dtype}": (3, 40, 1, dtype, kv_dtype, None),
                    f"decode, 4 splits, {dtype} cache {kv_dtype}": (3, 40, 1, dtype, kv_dtype, 4),
                    f"prefill {dtype} cache {kv_dtype}": (2, 70, 30, dtype, kv_dtype, None),
                }
            )
            # Sliding-window layers with soft-capped scores (Gemma 2 and 3, Mistral): a window shorter
            # than the contexts, in split decode and in prefill chunks, at Gemma's head dims.
            for head_dim in (128, 256):
                for query_len, splits in ((1, 4), (30, None)):
                    q, cache, meta = decode_batch(2, 70, dtype, kv_dtype, query_len, head_dim)
                    found.append(
                        (
                            f"window 16 softcap 50 head_dim {head_dim} query {query_len} {dtype} "
                            f"cache {kv_dtype}",
                            lambda q=q, c=cache, m=meta, s=splits: triton_paged_attention.paged_attention(
                                q, c, m, 0.1, window=16, softcap=50.0, num_splits=s
                            ),
                        )
                    )
            q, cache, meta = decode_batch(2, 20, dtype, kv_dtype)
            k = torch.randn(2, KV_HEADS, HEAD_DIM, dtype=dtype)
            cos_sin = torch.randn(64, HEAD_DIM)
            found.append(
                (
                    f"rotary_write_kv {dtype} into {kv_dtype}",
                    lambda q=q, c=cache, m=meta, k=k, cs=cos_sin: triton_rotary_kv_write.rotary_write_kv(
                        torch.arange(2), q, k, k.clone(), cs, c, m.slot_mapping
                    ),
                )
            )
    # GPT-OSS's layers: sinks folded into one split's softmax and into the merge of several, a
    # window of 128 keys at head_dim 64.
    for query_len, splits in ((1, 4), (30, None)):
        q, cache, meta = decode_batch(2, 300, torch.bfloat16, None, query_len, 64)
        sinks = torch.zeros(q.shape[1])
        found.append(
            (
                f"sinks window 128 head_dim 64 query {query_len}",
                lambda q=q, c=cache, m=meta, s=splits, k=sinks: triton_paged_attention.paged_attention(
                    q, c, m, 0.125, window=128, sinks=k, num_splits=s
                ),
            )
        )
    # Llama 4's chunked layers: a chunk of 32 keys, in split decode and in prefill chunks that cross it.
    for query_len, splits in ((1, 4), (30, None)):
        q, cache, meta = decode_batch(2, 70, torch.bfloat16, None, query_len)
        found.append(
            (
                f"chunked 32 query {query_len}",
                lambda q=q, c=cache, m=meta, s=splits: triton_paged_attention.paged_attention(
                    q, c, m, 0.125, window=32, chunked=True, num_splits=s
                ),
            )
        )
    found += _latent_attention_cases()
    x = torch.randn(5, 576, dtype=torch.bfloat16)
    found.append(("rms_norm", lambda: triton_rmsnorm.rms_norm(x, x[0], 1e-5, x)))
    found.append(("silu_and_mul", lambda: triton_silu_mul.silu_and_mul(x)))
    for vocab in (128256, 49152):  # Llama 3's vocabulary and the bundled model's
        logits, rows = torch.empty(4, vocab), torch.arange(3)
        params = (torch.ones(3), torch.zeros(3, dtype=torch.int32), torch.ones(3), torch.zeros(3))
        seeds, out = torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
        found.append(
            (
                f"sample vocab {vocab}",
                lambda a=(logits, rows, *params, seeds, out): triton_sampling.sample(*a),
            )
        )
    found += _matmul_cases([("small", 96, 256)], (1, 3, 17, 40, 100), (torch.bfloat16, torch.float16))
    found += _matmul_cases([("small", 40, 64)], (3,), (torch.float32,))
    return found + _moe_cases() + _gpt_oss_moe_cases() + _sigmoid_routing_moe_cases() + _lora_cases()


def _latent_attention_cases() -> list:
    """DeepSeek V3's absorbed attention on one of 8 ranks: 16 query heads over one cached latent and
    rotated key of 512 + 64, the values read from the keys' plane; split decode and a prefill chunk."""
    width, heads, found = 512 + 64, 16, []
    for query_len, splits in ((1, 4), (30, None)):
        _, _, meta = decode_batch(2, 300, torch.bfloat16, None, query_len, width)
        q = torch.randn(2 * query_len, heads, width, dtype=torch.bfloat16)
        cache = torch.zeros(1, 4, BLOCK_SIZE, 1, width, dtype=torch.bfloat16)
        found.append(
            (
                f"latent attention query {query_len}",
                lambda q=q, c=cache, m=meta, s=splits: triton_paged_attention.paged_attention(
                    q, c, m, 0.1, num_splits=s
                ),
            )
        )
    k, cos_sin = torch.randn(2, 1, width, dtype=torch.bfloat16), torch.randn(64, width)
    found.append(
        (
            "rotary_write_kv latent",
            lambda q=q[:2], c=cache, m=meta, k=k, cs=cos_sin: triton_rotary_kv_write.rotary_write_kv(
                torch.arange(2), q, k, None, cs, c, m.slot_mapping[:2]
            ),
        )
    )
    return found


def _llama_cases() -> list:
    gpu = torch.device("cuda")
    found = _attention_cases(
        {
            f"decode batch {batch} context 4096" + (", fp8 cache" if kv else ""): (
                batch,
                4096,
                1,
                torch.bfloat16,
                kv,
                triton_paged_attention.max_splits(batch, KV_HEADS, gpu),
            )
            for batch in (1, 64)
            for kv in (None, reference.FP8_KV_DTYPE)
        }
        | {
            "verify 5 tokens batch 1 context 4096": (
                1,
                4096,
                5,
                torch.bfloat16,
                None,
                triton_paged_attention.max_splits(1, KV_HEADS, gpu),
            ),
            "prefill 2048 tokens": (1, 2048, 2048, torch.bfloat16, None, None),
        }
    )
    # The kernel's code depends on K, the tiles and the kind, so qkv stands for every K = 4096 layer
    # at 16 and 64 rows; at 1 and 4 rows every layer, to set beside the GEMVs tuned per layer before.
    found += _matmul_cases(LLAMA3_8B_LAYERS, (1, 4), (torch.bfloat16,))
    return found + _matmul_cases(LLAMA3_8B_LAYERS[:1], (16, 64), (torch.bfloat16,))


def cases(which: str) -> list:
    # What the GPU of the figures has; a CPU tensor cannot tell.
    triton_paged_attention._multiprocessor_count = lambda index: SMS
    return _small_cases() if which == "test" else _llama_cases()
