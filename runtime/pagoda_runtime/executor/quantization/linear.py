"""Linear layers with packed weights, and the one place that picks the matmul for a device.

The model builds every projection through make_linear and feeds it weights row block by row
block (q, k and v into one fused qkv_proj): float weights are quantized on arrival, PackedWeights
from AWQ, GPTQ or GGUF checkpoints are stored as they are. A row-parallel layer of a
tensor-parallel model (`input_part`) keeps only its slice of the inputs, cut after quantizing the
whole row, so every rank holds exactly the numbers one process would.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import skip_init

from pagoda_runtime.contract.config import QUANTIZATION_METHODS
from pagoda_runtime.executor.quantization.cpu_packed import cpu_packed_weight
from pagoda_runtime.executor.quantization.online import ONLINE_QUANTIZERS, int4_group_size
from pagoda_runtime.executor.quantization.packed import PackedWeight
from pagoda_runtime.executor.quantization.reference import reference_matmul
from pagoda_runtime.executor.quantization.scaled_mm import fp8_scaled_mm, scaled_mm_supported

# Float weights that reach a layer of a pre-quantized checkpoint (a GGUF file may keep a few
# tensors in F16) are quantized with this method, chosen to lose as little as possible.
_FLOAT_FALLBACK = {"awq": "int4", "gptq": "int4", "gguf": "int8"}
# Up to this many activation rows the weight-streaming GEMV beats tensor-core tiles.
GEMV_MAX_ROWS = 4


def quantized_matmul(x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    """x [M, K] @ dequantized(weight)^T on the best path for x's device."""
    if not x.is_cuda:
        return reference_matmul(x, weight)
    # Triton is imported on the first CUDA call only, as in kernels/, so the CPU path never loads it.
    if x.shape[0] <= GEMV_MAX_ROWS:
        from pagoda_runtime.executor.quantization.triton_gemv import gemv

        return gemv(x, weight)
    if scaled_mm_supported(x, weight):
        return fp8_scaled_mm(x, weight)
    from pagoda_runtime.executor.quantization.triton_gemm import gemm

    return gemm(x, weight)


class QuantizedLinear(nn.Module):
    """y = x @ W^T (+ b) with W packed; `method` quantizes the float weights given to `load`."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        method: str,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
        input_part: slice | None = None,
    ) -> None:
        super().__init__()
        if method not in ONLINE_QUANTIZERS:
            raise ValueError(
                f"unknown online quantization {method!r}; use one of {', '.join(ONLINE_QUANTIZERS)}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.method = method
        self.input_part = input_part
        self.kind: str | None = None
        self.group_size = 0
        # Registered empty so that .to() and state_dict() see them once the first load fills them.
        for name in ("qweight", "scales", "offsets"):
            self.register_buffer(name, None)
        self.cpu_weight: nn.Module | None = None  # see pack_for_cpu
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self.bias = (
            nn.Parameter(torch.zeros(out_features, device=self._device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    @property
    def weight(self) -> PackedWeight:
        if self.qweight is None:
            if self.cpu_weight is not None:
                raise RuntimeError("this layer's weight is in torch's CPU kernel layout (cpu_weight) now")
            raise RuntimeError("this layer has no weight yet; call load() with its checkpoint tensor first")
        return PackedWeight(self.kind, self.qweight, self.scales, self.group_size, self.offsets)

    def load(self, weight: torch.Tensor | PackedWeight, row_offset: int = 0) -> None:
        """Store rows [row_offset, row_offset + rows) of W, quantizing a float weight first."""
        if not isinstance(weight, PackedWeight):
            weight = self._quantize(weight)
        if self.input_part is not None:
            weight = weight.columns(self.input_part)
        if weight.in_features != self.in_features or row_offset + weight.out_features > self.out_features:
            raise ValueError(
                f"a weight of {weight.out_features}x{weight.in_features} at row {row_offset} does not fit "
                f"this {self.out_features}x{self.in_features} layer; the checkpoint does not match its config"
            )
        if self.qweight is None:
            self._allocate(weight)
        elif (weight.kind, weight.group_size) != (self.kind, self.group_size):
            raise ValueError(
                f"the parts of this fused layer are stored differently ({weight.kind} in groups of "
                f"{weight.group_size} vs {self.kind} in groups of {self.group_size}); Pagoda fuses them "
                "into one matrix, so re-export the checkpoint with one format for all of them"
            )
        rows = slice(row_offset, row_offset + weight.out_features)
        for name, tensor in weight.tensors().items():
            stored = getattr(self, name)
            stored[rows] = tensor.to(stored.device)

    def load_bias(self, bias: torch.Tensor, row_offset: int = 0) -> None:
        self.bias.data[row_offset : row_offset + bias.shape[0]] = bias.to(self.bias.dtype)

    def _quantize(self, weight: torch.Tensor) -> PackedWeight:
        if self.method == "int4":
            # The whole row's width, also for a row-parallel shard: groups as one process has them.
            return ONLINE_QUANTIZERS["int4"](weight, int4_group_size(weight.shape[1]))
        return ONLINE_QUANTIZERS[self.method](weight)

    def _allocate(self, like: PackedWeight) -> None:
        self.kind, self.group_size = like.kind, like.group_size
        for name, tensor in like.tensors().items():
            shape = (self.out_features, *tensor.shape[1:])
            self.register_buffer(name, torch.zeros(shape, dtype=tensor.dtype, device=self._device))

    def pack_for_cpu(self) -> None:
        """Once every row is loaded: hand the weight to torch's CPU kernel for its kind, in that
        kernel's layout (cpu_packed.py), where one takes it; the buffers it came from are dropped."""
        packed = cpu_packed_weight(self.weight)
        if packed is not None:
            self.cpu_weight = packed
            self.qweight = self.scales = self.offsets = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The model's activations are already [tokens, features]: skipping the reshapes and the
        # packed weight's module call saves dispatch time that rivals the matmul's own at batch 1.
        x2d = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.cpu_weight is not None:
            y = self.cpu_weight.forward(x2d)
        else:
            y = quantized_matmul(x2d, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}"


class DenseLinear(nn.Linear):
    """An unquantized nn.Linear with the same row-block `load` (and `input_part`) as QuantizedLinear."""

    input_part: slice | None = None

    def load(self, weight: torch.Tensor, row_offset: int = 0) -> None:
        if isinstance(weight, PackedWeight):
            raise ValueError(
                "this checkpoint holds quantized weights; serve it with --quantization awq, gptq or gguf "
                "to match how it was saved"
            )
        if self.input_part is not None:
            weight = weight[:, self.input_part]
        self.weight.data[row_offset : row_offset + weight.shape[0]] = weight.to(self.weight.dtype)

    def load_bias(self, bias: torch.Tensor, row_offset: int = 0) -> None:
        self.bias.data[row_offset : row_offset + bias.shape[0]] = bias.to(self.bias.dtype)


def make_linear(
    in_features: int,
    out_features: int,
    bias: bool,
    method: str,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    input_part: slice | None = None,
) -> nn.Module:
    """The projection for a quantization method; both kinds take `load(weight, row_offset)`.

    input_part: for a row-parallel shard, which of the checkpoint's inputs it keeps (in_features
    of them); None keeps them all."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {method!r}; use one of {', '.join(QUANTIZATION_METHODS)}")
    if method == "none":
        # Uninitialized: the checkpoint fills every weight (see CausalLM.load_weights).
        device = torch.get_default_device() if device is None else device  # skip_init needs one
        layer = skip_init(DenseLinear, in_features, out_features, bias=bias, device=device, dtype=dtype)
        layer.requires_grad_(False)
        layer.input_part = input_part
        return layer
    return QuantizedLinear(
        in_features, out_features, bias, _FLOAT_FALLBACK.get(method, method), device, dtype, input_part
    )
