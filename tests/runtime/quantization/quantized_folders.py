"""Tiny AWQ and GPTQ checkpoints, packed the way AutoAWQ and AutoGPTQ pack them.

`build_quantized_folder(float_folder, dest, method)` copies a tiny float folder (tests/runtime/
tiny_models.py), quantizes every decoder projection to asymmetric int4 in groups along the inputs,
stores it in the method's layout (qweight, qzeros, scales, and g_idx for GPTQ) and writes the
matching quantization_config into config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
NATURAL_ORDER = list(range(8))


def pack_columns(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    """[R, C] of 0..15 -> int32 [R, C/8]; nibble i holds column 8j + order[i] (AutoAWQ/AutoGPTQ style)."""
    packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for i, column in enumerate(order):
        packed |= values[:, column::8].to(torch.int64) << (4 * i)
    return packed.to(torch.int32)  # wraps like numpy's uint32 -> int32 view


def _quantize(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [N, K] -> q [K, N] and zeros [K/G, N] in 0..15, fp16 scales [K/G, N]: w ~ (q - zero) * scale."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scales = ((high - low) / 15).clamp_min(1e-6).half()
    zeros = torch.round(-low / scales.float()).clamp(0, 15)
    q = torch.round(groups / scales.float()[..., None] + zeros[..., None]).clamp(0, 15)
    return q.reshape(n, k).t().to(torch.int32), zeros.t().to(torch.int32), scales.t().contiguous()


def _packed_tensors(weight: torch.Tensor, method: str, group_size: int) -> dict[str, torch.Tensor]:
    q, zeros, scales = _quantize(weight, group_size)
    if method == "awq":
        return {
            "qweight": pack_columns(q, AWQ_ORDER),
            "qzeros": pack_columns(zeros, AWQ_ORDER),
            "scales": scales,
        }
    k = q.shape[0]
    return {
        "qweight": pack_columns(q.t().contiguous(), NATURAL_ORDER).t().contiguous(),
        # AutoGPTQ's original format stores zero - 1.
        "qzeros": pack_columns((zeros - 1) & 0xF, NATURAL_ORDER),
        "scales": scales,
        "g_idx": torch.arange(k, dtype=torch.int32) // group_size,
    }


def quantization_config(method: str, group_size: int) -> dict:
    if method == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group_size,
            "version": "gemm",
            "zero_point": True,
        }
    return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False, "sym": False}


# The projections AutoAWQ and GPTQModel pack: every *_proj and Mixtral's experts' w1, w2 and w3
# (DeepSeek's kv_a_proj_with_mqa ends otherwise and stays in float, as a modules_to_not_convert would
# keep it).
QUANTIZED_SUFFIXES = ("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")


def build_quantized_folder(float_folder: Path, dest: Path, method: str, group_size: int = 32) -> Path:
    shutil.copytree(float_folder, dest)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(dest.glob("*.safetensors")):
        tensors.update(load_file(file))
        file.unlink()
    (dest / "model.safetensors.index.json").unlink(missing_ok=True)
    stored = {}
    for name, tensor in tensors.items():
        if name.startswith("model.layers.") and name.endswith(QUANTIZED_SUFFIXES):
            prefix = name.removesuffix("weight")
            for part, packed in _packed_tensors(tensor, method, group_size).items():
                stored[prefix + part] = packed
        else:
            stored[name] = tensor.contiguous()
    save_file(stored, dest / "model.safetensors")
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"] = quantization_config(method, group_size)
    (dest / "config.json").write_text(json.dumps(config))
    return dest
