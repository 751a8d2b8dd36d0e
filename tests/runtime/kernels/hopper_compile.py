"""Compiles every Triton kernel launch the runtime makes, for a Hopper GPU (sm_90), on a machine
without one: what Triton's interpreter never checks (tl.dot's minimum sizes, types only the
compiler sees) fails here as it would on the GPU.

Run as its own process (test_triton_compiles_for_hopper.py does): torch.cuda.is_available is made
to answer True before pagoda_runtime is imported, so pagoda_runtime.executor.triton_mode leaves the kernels
compiled; the public wrappers are then called on CPU tensors with each kernel replaced by a recorder,
so nothing is launched, and each recorded launch is compiled through ptxas to a cubin. Prints one
JSON object: {"kernels": [every kernel], "compiled": [launches], "failed": {launch: error},
"resources": {launch: {"registers", "stack", "local", "shared"}}} (per thread: registers, the stack
frame and local memory in bytes, where spills go; per program: shared memory in bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch

# Before triton is imported and pagoda_runtime decides how it runs: compiled kernels.
os.environ["TRITON_INTERPRET"] = "0"
torch.cuda.is_available = lambda: True

import triton  # noqa: E402
from pagoda_runtime.executor.kernels import (  # noqa: E402
    reference,
    triton_lora,
    triton_moe,
    triton_moe_routing,
    triton_paged_attention,
    triton_rmsnorm,
    triton_rotary_kv_write,
    triton_silu_mul,
)
from pagoda_runtime.executor.kernels.lora_slots import lora_batch  # noqa: E402
from pagoda_runtime.executor.kernels.moe_weights import PackedExperts  # noqa: E402
from pagoda_runtime.executor.quantization import triton_gemm, triton_gemv  # noqa: E402
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8  # noqa: E402
from pagoda_runtime.executor.quantization.packed import PackedWeight  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from tests.runtime.kernels.paged_batch import make_paged_batch  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(HOPPER)
KERNELS = [
    (triton_paged_attention, "_paged_attention_kernel"),
    (triton_paged_attention, "_merge_splits_kernel"),
    (triton_rotary_kv_write, "_rotary_kv_write_kernel"),
    (triton_rmsnorm, "_rms_norm_kernel"),
    (triton_silu_mul, "_silu_and_mul_kernel"),
    (triton_gemm, "_int4_gemm_kernel"),
    (triton_gemm, "_w8_gemm_kernel"),
    (triton_gemv, "_int4_gemv_kernel"),
    (triton_gemv, "_w8_gemv_kernel"),
    (triton_moe, "_moe_gemm_kernel"),
    (triton_moe_routing, "_route_kernel"),
    (triton_moe_routing, "_align_kernel"),
    (triton_lora, "_lora_shrink_kernel"),
    (triton_lora, "_lora_expand_kernel"),
]
# Mixture-of-experts layers: (hidden, intermediate, top_k, dtype, expert kinds, batch sizes). The
# batches' pairs per expert pick each default tile shape (1, 24, 100, 300 for bf16).
MOE_LAYERS = {
    "qwen3-30b-a3b": (2048, 768, 8, torch.bfloat16, ("float", "int8", "fp8", "int4"), (1, 24, 100, 300)),
    "mixtral-8x7b": (4096, 14336, 2, torch.bfloat16, ("float",), (1, 300)),
    "tiny": (64, 32, 2, torch.float32, ("float",), (1, 24)),
}
# LoRA on Llama-3-8B's projections (input width, output parts): three parts, and the long input.
LORA_PROJECTIONS = {"qkv": (4096, (4096, 1024, 1024)), "down": (14336, (4096,))}


class Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the launch instead."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches, self.label = kernel, launches, ""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.label, self.kernel, args, kwargs))


def _source(kernel, args, kwargs):
    """The launch as the JIT would compile it: Triton's own binder gives the argument types and the
    specializations a real launch gets (pointers 16-byte aligned, integers divisible by 16), without
    which loads are not vectorized or pipelined and the resource figures mean little."""
    binder = create_function_from_signature(kernel.signature, kernel.params, BACKEND)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        BACKEND, kwargs, bound_args, specialization, options
    )
    return ASTSource(kernel, signature, constexprs, attrs), options.__dict__


def _launches() -> list:
    launches: list = []
    recorders = {}
    for module, name in KERNELS:
        recorders[name] = Recorder(getattr(module, name), launches)
        setattr(module, name, recorders[name])

    def record(label, fn):
        for recorder in recorders.values():
            recorder.label = label
        fn()

    for dtype, head_dim, kv_dtype in [
        (torch.float32, 8, None),  # the tiny test models: head_dim 8
        (torch.bfloat16, 128, None),
        (torch.bfloat16, 64, reference.FP8_KV_DTYPE),
    ]:
        for seqs, splits in [([(40, 1), (17, 1)], 4), ([(40, 30), (9, 1)], None)]:
            batch = make_paged_batch(seqs, 8, 2, head_dim, 16, dtype=dtype, kv_cache_dtype=kv_dtype)
            label = f"attention {dtype} head_dim {head_dim} cache {kv_dtype} splits {splits}"
            record(
                label,
                lambda b=batch, s=splits: triton_paged_attention.paged_attention(
                    b.q, b.kv_cache, b.meta, 0.1, num_splits=s
                ),
            )
        if head_dim == 128:
            # Sliding-window layers and soft-capped scores (Gemma 2 and 3, Mistral): a window shorter
            # than the contexts, with split-K decode and with prefill chunks, at Gemma 3's head dims.
            for window_head_dim in (128, 256):
                for seqs, splits in [([(40, 1), (17, 1)], 4), ([(40, 30), (9, 1)], None)]:
                    batch = make_paged_batch(seqs, 8, 2, window_head_dim, 16, dtype=dtype)
                    record(
                        f"attention window 16 softcap 50 {dtype} head_dim {window_head_dim} splits {splits}",
                        lambda b=batch, s=splits: triton_paged_attention.paged_attention(
                            b.q, b.kv_cache, b.meta, 0.1, window=16, softcap=50.0, num_splits=s
                        ),
                    )
        cos_sin = torch.randn(64, head_dim)
        record(
            f"rotary_write_kv {dtype} into {kv_dtype}",
            lambda b=batch, c=cos_sin: triton_rotary_kv_write.rotary_write_kv(
                torch.arange(b.q.shape[0]) % 64, b.q, b.k_new, b.v_new, c, b.kv_cache, b.meta.slot_mapping
            ),
        )
    x = torch.randn(5, 576, dtype=torch.bfloat16)
    record("rms_norm", lambda: triton_rmsnorm.rms_norm(x, x[0], 1e-5, x))
    record("silu_and_mul", lambda: triton_silu_mul.silu_and_mul(x))
    w = torch.randn(96, 64)
    for name, weight in [
        ("int4", quantize_int4(w, 32)),
        ("int8", quantize_int8(w)),
        ("fp8", quantize_fp8(w)),
    ]:
        for dtype, rows in [(torch.float32, 3), (torch.bfloat16, 20)]:
            xs = torch.randn(rows, 64, dtype=dtype)
            matmul = triton_gemv.gemv if rows <= 4 else triton_gemm.gemm
            record(f"{matmul.__name__} {name} {dtype} rows {rows}", lambda m=matmul, a=xs, q=weight: m(a, q))
    _record_moe(record)
    _record_lora(record)
    return launches


def _packed_experts(kind: str, experts: int, n: int, k: int) -> PackedExperts:
    """Uninitialized experts of the real layout: only shapes and types reach the compiler."""
    rows = experts * n
    if kind == "int4":
        weight = PackedWeight(
            "int4",
            torch.empty(rows, k // 2, dtype=torch.uint8),
            torch.empty(rows, k // 128, dtype=torch.float16),
            128,
            torch.empty(rows, k // 128, dtype=torch.float16),
        )
    elif kind == "int8":
        weight = PackedWeight("int8", torch.empty(rows, k, dtype=torch.int8), torch.empty(rows, 1).half(), k)
    else:
        weight = PackedWeight("fp8", torch.empty(rows, k, dtype=torch.float8_e4m3fn), torch.empty(rows, 1), k)
    return PackedExperts(weight, experts)


def _record_moe(record) -> None:
    # Only the routed experts' count matters to the compiler; top_k of them keep the weights small.
    for model, (hidden, inter, top_k, dtype, kinds, batches) in MOE_LAYERS.items():
        experts = top_k
        for kind in kinds:
            if kind == "float":
                w_gate_up = torch.empty(experts, 2 * inter, hidden, dtype=dtype)
                w_down = torch.empty(experts, hidden, inter, dtype=dtype)
            else:
                w_gate_up = _packed_experts(kind, experts, 2 * inter, hidden)
                w_down = _packed_experts(kind, experts, hidden, inter)
            for tokens in batches:
                x = torch.randn(tokens, hidden, dtype=dtype)
                logits = torch.randn(tokens, experts)
                record(
                    f"moe {model} {kind} {dtype} tokens {tokens}",
                    lambda x=x, lg=logits, g=w_gate_up, d=w_down, k=top_k: triton_moe.fused_moe(
                        x, lg, g, d, k, True
                    ),
                )


def _record_lora(record) -> None:
    # Four adapter slots: a decode batch of rank 16 and a prefill chunk of rank 64.
    for name, (in_features, parts) in LORA_PROJECTIONS.items():
        for dtype, tokens, rank in [(torch.bfloat16, 32, 16), (torch.bfloat16, 2048, 64)]:
            x = torch.randn(tokens, in_features, dtype=dtype)
            out = torch.empty(tokens, sum(parts), dtype=dtype)
            lora_a = torch.empty(len(parts), 4, rank, in_features, dtype=dtype)
            lora_b = torch.empty(4, sum(parts), rank, dtype=dtype)
            batch = lora_batch(torch.arange(tokens) % 5 - 1, 4)
            record(
                f"lora {name} {dtype} tokens {tokens} rank {rank}",
                lambda o=out, x=x, b=batch, a=lora_a, lb=lora_b, p=parts: triton_lora.add_lora(
                    o, x, b, a, lb, torch.ones(4), p
                ),
            )
    x = torch.randn(5, 64)
    record(
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


def _resources(compiled) -> dict[str, int]:
    """Registers, stack frame and local memory per thread, from the cubin; shared memory per program."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        report = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True)
    usage = dict(
        field.split(":")[:2]
        for line in report.stdout.splitlines()
        if "REG:" in line
        for field in line.split()
    )
    return {
        "registers": int(usage["REG"]),
        "stack": int(usage["STACK"]),
        "local": int(usage["LOCAL"]),
        "shared": int(compiled.metadata.shared),
    }


def main() -> int:
    compiled, failed, resources = [], {}, {}
    seen: dict[str, int] = {}
    for label, kernel, args, kwargs in _launches():
        name = f"{kernel.fn.__name__} ({label})"
        seen[name] = seen.get(name, 0) + 1
        name += f" #{seen[name]}" if seen[name] > 1 else ""
        source, options = _source(kernel, args, dict(kwargs))
        try:
            resources[name] = _resources(triton.compile(source, target=HOPPER, options=options))
            compiled.append(name)
        except Exception as error:  # report every launch that fails, not only the first
            failed[name] = f"{type(error).__name__}: {str(error)[-400:]}"
    kernels = [name for _, name in KERNELS]
    print(json.dumps({"kernels": kernels, "compiled": compiled, "failed": failed, "resources": resources}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
