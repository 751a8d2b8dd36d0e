"""Checkpoints in the compressed-tensors format (quantization_config.quant_method "compressed-tensors":
what llm-compressor writes, the FP8, W8A8 and W4A16 releases vLLM users deploy) and Meta's
per-row FP8 ("fbgemm_fp8": Llama 3.1 405B FP8).

Each quantized projection keeps its stored tensors beside its name:
- FP8 ("float-quantized") and INT8 ("int-quantized"): `weight` as float8_e4m3fn or int8 [N, K] and
  `weight_scale`, one per tensor, per output row [N, 1] or per block (w = stored * scale); fbgemm's
  Llama 4 experts fused per layer, `experts.gate_up_proj` [E, H, 2I] and `experts.down_proj`
  [E, I, H], each with a `_scale` per expert and output (Llama-4-Maverick-FP8). They are
  dequantized at load into the model's float dtype and --quantization auto holds them in 8 bits
  again (fp8 or int8: one scale per output row, executor/quantization/online.py), so the model
  keeps the checkpoint's size;
- INT4 ("pack-quantized", symmetric): `weight_packed` int32 [N, K / 8], eight 4-bit values per word
  along the inputs (value i in bits 4i..4i+3, stored plus 8), `weight_scale` [N, K / G] per group of
  G inputs (or per row), `weight_shape` [N, K]: converted once into the int4 PackedWeight layout
  AWQ and GPTQ checkpoints arrive in (LLM-compressor's W4A16 is GPTQ's algorithm), served as "gptq".
Static activation scales (`input_scale`) are not read: activations are quantized as Pagoda's own
kernels do. Other schemes (asymmetric or act-ordered INT4, 2:4 sparsity, FP4, 8-bit packing) are
refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pagoda_runtime.executor.quantization.hf_checkpoints import int4_to_packed
from pagoda_runtime.executor.quantization.packed import PackedWeight
from pagoda_runtime.loading import fp8_blocks

# The stored kind of each format, by the weights' (type, bits).
_FORMATS = {
    ("float-quantized", "float", 8): "fp8",
    ("naive-quantized", "float", 8): "fp8",
    ("int-quantized", "int", 8): "int8",
    ("naive-quantized", "int", 8): "int8",
    ("pack-quantized", "int", 4): "int4",
}
_STRATEGIES = {
    "fp8": ("tensor", "channel", "block"),
    "int8": ("tensor", "channel"),
    "int4": ("group", "channel"),
}


class CompressedTensorsError(ValueError):
    """A quantization_config of these formats that Pagoda does not read."""


@dataclass(frozen=True)
class CompressedScheme:
    """kind: "fp8", "int8" (dequantized at load) or "int4" (kept packed); strategy: how scales
    cover the weight ("tensor", "channel", "block" or "group"); group_size: inputs per INT4 scale;
    block: (rows, inputs) per block scale."""

    kind: str
    strategy: str
    group_size: int | None = None
    block: tuple[int, int] | None = None

    @property
    def stored(self) -> str:
        """What LoadedModel.quantization reports (contract/quantization_selection.py)."""
        return "gptq" if self.kind == "int4" else self.kind

    def stores(self, name: str, found: dict[str, tuple[int, ...]]) -> bool:
        """Whether weight `name` is stored quantized (the ignored layers and the router stay float)."""
        if self.kind == "int4":
            return name.removesuffix("weight") + "weight_packed" in found
        return _scale_name(name) in found

    def parts(self, name: str, shape: tuple[int, ...], found: dict[str, tuple[int, ...]]) -> dict[str, tuple]:
        """The stored tensors of weight `name` (of float shape [N, K], or a layer's fused experts
        [E, K, N]) and the shapes they must have."""
        if len(shape) == 3:
            # One scale per expert and output, [E, 1, N] (gate_up) or [E, N, 1] (down) as fbgemm saves them.
            experts, _, outputs = shape
            scale = found.get(_scale_name(name))
            expected = (
                scale if scale in ((experts, outputs, 1), (experts, 1, outputs)) else (experts, 1, outputs)
            )
            return {name: shape, _scale_name(name): expected}
        rows, inputs = shape
        prefix = name.removesuffix("weight")
        if self.kind == "int4":
            groups = 1 if self.strategy == "channel" else -(-inputs // self.group_size)
            return {
                prefix + "weight_packed": (rows, inputs // 8),
                prefix + "weight_scale": (rows, groups),
                prefix + "weight_shape": (2,),
            }
        if self.strategy == "tensor":
            # One scale, saved as [] or [1] by different versions.
            scale = found.get(prefix + "weight_scale")
            scale_shape = scale if scale is not None and len(scale) <= 1 else (1,)
        elif self.strategy == "channel":
            scale_shape = (rows, 1)
        else:
            scale_shape = fp8_blocks.scale_shape(shape, self.block)
        return {name: shape, prefix + "weight_scale": scale_shape}

    def load(
        self, name: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor | PackedWeight:
        """Weight `name` from its stored tensors (named as `parts` names them)."""
        prefix = name.removesuffix("weight")
        if self.kind == "int4":
            packed = tensors[prefix + "weight_packed"]
            return int4_to_packed(
                packed, tensors[prefix + "weight_scale"], self.group_size or packed.shape[1] * 8
            )
        weight, scale = tensors[name], tensors[_scale_name(name)]
        if weight.dim() == 3:
            return (weight.float() * scale.float().reshape(weight.shape[0], 1, -1)).to(dtype)
        if self.strategy == "block":
            return fp8_blocks.dequantize(weight, scale, self.block, dtype)
        # A tensor's one scale, or a row's: [N, 1] broadcasts along the inputs.
        return (weight.float() * scale.float().reshape(-1, 1)[: weight.shape[0]]).to(dtype)


def _scale_name(name: str) -> str:
    """A weight's scale: X.weight_scale beside X.weight; beside a layer's fused experts
    (experts.gate_up_proj, Llama 4's as fbgemm saves them) experts.gate_up_proj_scale."""
    return name.removesuffix("weight") + "weight_scale" if name.endswith(".weight") else name + "_scale"


def scheme_of(raw: dict[str, Any]) -> CompressedScheme | None:
    """The scheme of a config.json in these formats; None for any other checkpoint."""
    qc = raw.get("quantization_config") or {}
    method = str(qc.get("quant_method", "")).lower()
    if method == "fbgemm_fp8":
        return CompressedScheme("fp8", "channel")
    if method != "compressed-tensors":
        return None
    groups = qc.get("config_groups") or {}
    weights = [group.get("weights") for group in groups.values() if isinstance(group, dict)]
    if not weights or any(not isinstance(w, dict) for w in weights) or any(w != weights[0] for w in weights):
        raise CompressedTensorsError(
            "its compressed-tensors config_groups do not quantize every layer's weights the same way; "
            "Pagoda reads one weight scheme per checkpoint"
        )
    args = weights[0]
    fmt = str(qc.get("format", "")).lower()
    kind = _FORMATS.get((fmt, args.get("type"), args.get("num_bits")))
    if kind is None:
        raise CompressedTensorsError(
            f"its compressed-tensors format {fmt!r} with {args.get('num_bits')}-bit {args.get('type')} "
            "weights is not one Pagoda reads; it reads FP8 (float-quantized), INT8 (int-quantized) and "
            "symmetric INT4 (pack-quantized) checkpoints"
        )
    strategy = args.get("strategy")
    if strategy not in _STRATEGIES[kind]:
        raise CompressedTensorsError(
            f"its {kind.upper()} weights are scaled by {strategy!r}; Pagoda reads {kind.upper()} scales per "
            f"{', '.join(_STRATEGIES[kind])}"
        )
    if not args.get("symmetric", True) or args.get("actorder") or args.get("dynamic"):
        raise CompressedTensorsError(
            "its weights are quantized asymmetrically, in activation order or dynamically; Pagoda reads "
            "symmetric, statically scaled weights in input order (llm-compressor's defaults)"
        )
    group_size = args.get("group_size") if strategy == "group" else None
    if strategy == "group" and not (
        isinstance(group_size, int) and group_size >= 32 and group_size & (group_size - 1) == 0
    ):
        raise CompressedTensorsError(
            f"its INT4 groups are {group_size!r} inputs; Pagoda reads groups of a power of two from 32 up"
        )
    block = None
    if strategy == "block":
        structure = args.get("block_structure")
        if not (
            isinstance(structure, list)
            and len(structure) == 2
            and all(isinstance(b, int) and b > 0 for b in structure)
        ):
            raise CompressedTensorsError(f"its block_structure {structure!r} is not [rows, inputs]")
        block = (structure[0], structure[1])
    return CompressedScheme(kind, strategy, group_size, block)
