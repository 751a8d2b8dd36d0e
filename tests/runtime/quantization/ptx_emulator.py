"""Runs the few PTX instructions of triton_mma.py's inline assembly on numpy arrays of 32-bit
registers, one lane per element, so that the tests can check the assembly the GPU executes against
the arithmetic the interpreter executes, on every input value."""

from __future__ import annotations

import re

import numpy as np
import torch

MASK = np.uint64(0xFFFFFFFF)


def _prmt(a: np.ndarray, b: np.ndarray, selector: int) -> np.ndarray:
    """prmt.b32 in its default mode: result byte i is byte (selector nibble i & 7) of b:a, or that
    byte's sign replicated when the nibble's high bit is set."""
    pool = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros_like(pool)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = (pool >> np.uint64(8 * (nibble & 7))) & np.uint64(0xFF)
        if nibble & 8:
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * i)
    return out & MASK


def _lop3(a, b, c, lut: int) -> np.ndarray:
    out = np.zeros_like(a)
    for bit in range(8):
        if lut >> bit & 1:
            term = np.full_like(a, MASK)
            for value, source in zip((bit >> 2 & 1, bit >> 1 & 1, bit & 1), (a, b, c), strict=True):
                term &= source if value else ~source & MASK
            out |= term
    return out


def _halves(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x & np.uint64(0xFFFF), (x >> np.uint64(16)) & np.uint64(0xFFFF)


def _halfwise(a: np.ndarray, b: np.ndarray, dtype: torch.dtype, op) -> np.ndarray:
    """A bf16x2 / f16x2 instruction: op on each half as `dtype`, exactly, rounded to nearest even."""
    out = np.zeros_like(a)
    for shift in (0, 16):
        lanes = [((v >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.uint16) for v in (a, b)]
        floats = [torch.from_numpy(lane.view(np.int16)).view(dtype).double() for lane in lanes]
        result = op(*floats).to(dtype)
        out |= result.view(torch.int16).numpy().view(np.uint16).astype(np.uint64) << np.uint64(shift)
    return out


def _e4m3x2_to_f16x2(x: np.ndarray) -> np.ndarray:
    """cvt.rn.f16x2.e4m3x2: the low byte to the low half."""
    out = np.zeros_like(x)
    for shift in (0, 8):
        byte = torch.from_numpy(((x >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.uint8))
        half = byte.view(torch.float8_e4m3fn).to(torch.float16).view(torch.int16).numpy().astype(np.uint16)
        out |= half.astype(np.uint64) << np.uint64(2 * shift)
    return out


def run(asm: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute `asm` (the body between braces) with registers named in `inputs` (e.g. "$4") set;
    returns every register written."""
    regs = {name: value.astype(np.uint64) & MASK for name, value in inputs.items()}

    def value(operand: str) -> np.ndarray:
        operand = operand.strip()
        if operand in regs:
            return regs[operand]
        return np.full_like(next(iter(regs.values())), np.uint64(int(operand, 0)) & MASK)

    for line in asm.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):
            names, source = re.match(r"\{(.*)\},\s*(\S+)", rest).groups()
            lo, hi = _halves(value(source))
            regs[names.split(",")[0].strip()], regs[names.split(",")[1].strip()] = lo, hi
            continue
        dest, *args = [part.strip() for part in rest.split(",")]
        if op == "mov.b32":
            result = value(args[0])
        elif op == "prmt.b32":
            result = _prmt(value(args[0]), value(args[1]), int(args[2], 0))
        elif op == "lop3.b32":
            result = _lop3(value(args[0]), value(args[1]), value(args[2]), int(args[3], 0))
        elif op == "shr.u32":
            result = value(args[0]) >> np.uint64(int(args[1]))
        elif op == "shl.b32":
            result = (value(args[0]) << np.uint64(int(args[1]))) & MASK
        elif op == "and.b32":
            result = value(args[0]) & value(args[1])
        elif op == "mul.rn.bf16x2":
            result = _halfwise(value(args[0]), value(args[1]), torch.bfloat16, lambda x, y: x * y)
        elif op in ("sub.rn.bf16x2", "sub.rn.f16x2"):
            dtype = torch.bfloat16 if "bf16" in op else torch.float16
            result = _halfwise(value(args[0]), value(args[1]), dtype, lambda x, y: x - y)
        elif op == "cvt.rn.f16x2.e4m3x2":
            result = _e4m3x2_to_f16x2(value(args[0]))
        else:
            raise NotImplementedError(f"the emulator does not know {op}")
        regs[dest] = result
    return regs
