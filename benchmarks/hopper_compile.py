"""Compiles the runtime's Triton kernel launches for a Hopper GPU (sm_90) on a machine without one,
and reports what ptxas made of each: registers, spills, shared memory, blocks per multiprocessor,
whether the main loop is software-pipelined (asynchronous copies in flight), its instructions per
iteration and, for the matmul kernels, per weight.

    PYTHONPATH=runtime python benchmarks/hopper_compile.py [--cases test|llama] [--result-json PATH]

`test` (the default) compiles small launches of every kernel in every dtype: what Triton's
interpreter never checks (tl.dot's minimum sizes, types only the compiler sees) fails here as it
would on the GPU (tests/runtime/kernels/test_triton_compiles_for_hopper.py runs it). `llama`
compiles the launches a Llama-3-8B decode and prefill make, with the full report; BENCHMARKS.md's
compile tables are written from its JSON. `--before` records the launches of the kernels as they
were at commit 00b838f (their API); run it on that commit's runtime to regenerate the baseline:

    git archive 00b838f runtime | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/runtime python benchmarks/hopper_compile.py --before --cases llama \\
        --result-json benchmarks/results/sm90/compile_before.json

Run as its own process: torch.cuda.is_available answers True before pagoda_runtime is imported, so
triton_mode leaves the kernels compiled; the public wrappers are then called on CPU tensors with
each kernel replaced by a recorder, so nothing is launched. Each recorded launch is specialized by
Triton's own argument binder (16-byte aligned pointers, integers divisible by 16, as the launcher
does on a GPU) and compiled through ptxas to a cubin, which Triton's cuobjdump disassembles.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

# Before triton is imported and pagoda_runtime decides how it runs: compiled kernels.
os.environ["TRITON_INTERPRET"] = "0"
torch.cuda.is_available = lambda: True

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# H100 / H200 per multiprocessor.
REGISTERS_PER_SM, SHARED_PER_SM, MAX_BLOCKS, MAX_WARPS = 65536, 233472, 32, 64
SHARED_RESERVED_PER_BLOCK = 1024
ASYNC_COPIES = ("LDGSTS", "UTMALDG", "UBLKCP")
MMA = ("HMMA", "HGMMA", "QGMMA")
CONVERSIONS = ("I2F", "F2F", "F2FP", "I2FP")


class Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the launch instead."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches, self.label = kernel, launches, ""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.label, self.kernel, args, kwargs))


def record(modules_and_names, cases) -> list:
    """Every launch each case makes, as (label, kernel, args, kwargs)."""
    launches: list = []
    recorders = []
    for module, name in modules_and_names:
        recorder = Recorder(getattr(module, name), launches)
        setattr(module, name, recorder)
        recorders.append(recorder)
    for label, fn in cases:
        for recorder in recorders:
            recorder.label = label
        fn()
    return launches


def compile_launch(kernel, args, kwargs):
    """The launch compiled for sm_90 as Triton's launcher would specialize it."""
    backend = CUDABackend(HOPPER)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    source = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=HOPPER, options=options.__dict__)


def _tool(name: str, *args: str) -> str:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, check=True).stdout


def _instructions(sass: str) -> list[tuple[int, str]]:
    found = re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass, re.M)
    return [(int(address, 16), text) for address, text in found]


def _opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def main_loop(sass: str) -> list[str]:
    """The opcodes of the longest loop body (a backward branch's range) of the kernel."""
    instructions = _instructions(sass)
    best: list[str] = []
    for address, text in instructions:
        if _opcode(text) != "BRA":
            continue
        targets = re.findall(r"0x([0-9a-f]+)", text)
        if targets and int(targets[-1], 16) < address:
            start = int(targets[-1], 16)
            body = [_opcode(t) for a, t in instructions if start <= a <= address]
            best = max(best, body, key=len)
    return best


def blocks_per_sm(registers: int, shared: int, num_warps: int) -> int:
    per_warp = -(-registers * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
    by_registers = REGISTERS_PER_SM // (per_warp * num_warps)
    by_shared = SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK)
    return min(MAX_BLOCKS, MAX_WARPS // num_warps, by_registers, by_shared)


def usage(compiled) -> dict[str, int]:
    """Registers, stack frame and local memory (where spills go) per thread; shared memory per program."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        found = _tool("cuobjdump", "--dump-resource-usage", str(cubin))
    return {
        "registers": int(re.search(r"REG:(\d+)", found)[1]),
        "stack": int(re.search(r"STACK:(\d+)", found)[1]),
        "local": int(re.search(r"LOCAL:(\d+)", found)[1]),
        "shared": int(compiled.metadata.shared),
    }


def report(compiled, num_warps: int, num_stages: int, work_per_iteration: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = _tool("cuobjdump", "--dump-resource-usage", str(cubin))
        sass = _tool("cuobjdump", "--dump-sass", str(cubin))
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        arch = re.search(r"\.target\s+(sm_\w+)", compiled.asm["ptx"])[1]
        ptxas = subprocess.run(
            [str(BIN / "ptxas"), f"-arch={arch}", "-v", str(ptx), "-o", os.devnull],
            capture_output=True,
            text=True,
        ).stderr
    registers = int(re.search(r"REG:(\d+)", usage)[1])
    stack = int(re.search(r"STACK:(\d+)", usage)[1])
    spill_stores = sum(int(b) for b in re.findall(r"(\d+) bytes spill stores", ptxas))
    spill_loads = sum(int(b) for b in re.findall(r"(\d+) bytes spill loads", ptxas))
    shared = compiled.metadata.shared
    loop = main_loop(sass)
    ops = Counter(op.split(".")[0] for op in loop)
    result = {
        "registers": registers,
        "spill_store_bytes": spill_stores,
        "spill_load_bytes": spill_loads,
        "stack_bytes": stack,
        "shared_bytes": shared,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "blocks_per_sm": blocks_per_sm(registers, shared, num_warps),
        "loop_instructions": len(loop),
        "loop_async_copies": sum(ops[o] for o in ASYNC_COPIES),
        "loop_mma": sum(ops[o] for o in MMA),
        "loop_mma_kind": sorted({o for o in loop if o.split(".")[0] in MMA}),
        "loop_conversions": sum(ops[o] for o in CONVERSIONS),
        "loop_top_opcodes": dict(ops.most_common(8)),
    }
    result["pipelined"] = result["loop_async_copies"] > 0
    if work_per_iteration and loop:
        result["instructions_per_weight"] = round(len(loop) * 32 * num_warps / work_per_iteration, 3)
    return result


def _mma_work(constexprs: dict) -> int:
    return constexprs["BLOCK_N"] * constexprs["CHUNK"] * constexprs["TILES"]


def _gemv_work(constexprs: dict) -> int:
    return constexprs["BLOCK_N"] * constexprs["BLOCK_K"]


# Weights (elements of the weight matrix) one iteration of a program's main loop multiplies; the
# GEMVs are those of commit 00b838f (--before).
WORK_PER_ITERATION = {
    "_mma_kernel": _mma_work,
    "_w8_gemv_kernel": _gemv_work,
    "_int4_gemv_kernel": _gemv_work,
}


def run(launches, full_report: bool) -> dict:
    compiled_names, failed, reports, resources = [], {}, [], {}
    seen: Counter = Counter()
    for label, kernel, args, kwargs in launches:
        name = f"{kernel.fn.__name__} ({label})"
        seen[name] += 1
        name += f" #{seen[name]}" if seen[name] > 1 else ""
        try:
            compiled = compile_launch(kernel, args, dict(kwargs))
        except Exception as error:  # report every launch that fails, not only the first
            failed[name] = f"{type(error).__name__}: {str(error)[-400:]}"
            continue
        compiled_names.append(name)
        resources[name] = usage(compiled)
        if full_report:
            constexprs = dict(zip(kernel.arg_names, args, strict=False)) | kwargs
            work = WORK_PER_ITERATION.get(kernel.fn.__name__, lambda _: None)(constexprs)
            # A loop's own depth (tl.range's num_stages) where the kernel takes one, else the launch's.
            stages = constexprs.get("NUM_STAGES", compiled.metadata.num_stages)
            reports.append(
                {"kernel": kernel.fn.__name__, "launch": label}
                | report(compiled, kwargs.get("num_warps", 4), stages, work)
            )
    return {"compiled": compiled_names, "failed": failed, "resources": resources, "reports": reports}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", choices=("test", "llama"), default="test")
    parser.add_argument("--before", action="store_true", help="the launches of commit 00b838f's kernels")
    parser.add_argument("--result-json", help="also write the result here")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    if args.before:
        from compile_cases_before import KERNELS, cases
    else:
        from compile_cases import KERNELS, cases
    result = {
        "target": "sm_90 (Hopper), ptxas of triton " + triton.__version__,
        "cases": args.cases,
        "kernels": [name for _, name in KERNELS],
        "shared_per_program": SHARED_PER_SM - SHARED_RESERVED_PER_BLOCK,
    } | run(record(KERNELS, cases(args.cases)), full_report=args.cases == "llama")
    text = json.dumps(result, indent=1)
    if args.result_json:
        Path(args.result_json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
