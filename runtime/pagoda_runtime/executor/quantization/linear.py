"""Linear layers with packed weights, and the one place that picks the matmul for a device: the
PyTorch reference or torch's packed CPU kernels on a CPU (cpu_packed.py), on CUDA the path
dispatch.py's table names for the layer's kind, batch rows and shape (gpu_packed.py).

The model builds every projection through make_linear and feeds it weights row block by row
block (q, k and v into one fused qkv_proj): float weights are quantized on arrival, PackedWeights
from AWQ, GPTQ or GGUF checkpoints are stored as they are. The parts of a fused layer are stored
in one matrix when they share a layout; a part stored differently (a GGUF Q4_K_M file's Q6_K
v_proj beside Q4_K q and k) makes the layer hold each part as a row block of its own, each
multiplied by its own kernel and the outputs concatenated, as vLLM does for GGUF shards. A
row-parallel layer of a tensor-parallel model (`input_part`) keeps only its slice of the inputs,
cut after quantizing the whole row, so every rank holds exactly the numbers one process would.
"""

from __future__ import annotations

from bisect import bisect

import torch
from torch import nn
from torch.nn.utils import skip_init

from pagoda_runtime.contract.config import QUANTIZATION_METHODS
from pagoda_runtime.executor.quantization.cpu_packed import cpu_packed_weight
from pagoda_runtime.executor.quantization.online import ONLINE_QUANTIZERS, int4_group_size
from pagoda_runtime.executor.quantization.packed import PackedWeight
from pagoda_runtime.executor.quantization.reference import reference_matmul

# A pre-quantized checkpoint's layers hold what it stores: packed weights as they are, and float
# ones as floats in row blocks of their own, never quantized again: a projection an AWQ or GPTQ
# checkpoint left in float (its modules_to_not_convert), a GGUF block type without a packed layout,
# a GGUF F16 tensor.
_AS_STORED = ("awq", "gptq", "gguf")


class QuantizedLinear(nn.Module):
    """y = x @ W^T (+ b) with W packed; `method` quantizes the float weights given to `load`, or
    ("none") keeps them as float row blocks."""

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
        if method not in ONLINE_QUANTIZERS and method != "none":
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
        # Rows loaded into qweight so far, and, once parts differ in layout, a layer per part in
        # row order (row_blocks) with the first row of each (row_starts).
        self.loaded_rows: list[tuple[int, int]] = []
        self.row_blocks: nn.ModuleList | None = None
        self.row_starts: list[int] = []
        self.gpu_weight: nn.Module | None = None  # see pack_for_gpu
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._dtype = dtype
        self.bias = (
            nn.Parameter(torch.zeros(out_features, device=self._device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    @property
    def weight(self) -> PackedWeight:
        if self.qweight is None:
            if self.row_blocks is not None:
                raise RuntimeError("this layer holds its parts as separate row blocks (row_blocks)")
            if self.cpu_weight is not None or self.gpu_weight is not None:
                raise RuntimeError(
                    "this layer's weight is in its kernel's layout (cpu_weight / gpu_weight) now"
                )
            raise RuntimeError("this layer has no weight yet; call load() with its checkpoint tensor first")
        return PackedWeight(self.kind, self.qweight, self.scales, self.group_size, self.offsets)

    def load(self, weight: torch.Tensor | PackedWeight, row_offset: int = 0) -> None:
        """Store rows [row_offset, row_offset + rows) of W, quantizing a float weight first (or,
        with method "none", keeping it as a float row block)."""
        packed = isinstance(weight, PackedWeight)
        if not packed and self.method != "none":
            weight, packed = self._quantize(weight), True
        if self.input_part is not None:
            weight = weight.columns(self.input_part) if packed else weight[:, self.input_part]
        rows, width = (weight.out_features, weight.in_features) if packed else tuple(weight.shape)
        if width != self.in_features or row_offset + rows > self.out_features:
            raise ValueError(
                f"a weight of {rows}x{width} at row {row_offset} does not fit "
                f"this {self.out_features}x{self.in_features} layer; the checkpoint does not match its config"
            )
        if (
            not packed
            or self.row_blocks is not None
            or (self.qweight is not None and _layout(weight) != _layout(self.weight))
        ):
            self._load_row_block(weight, row_offset)
            return
        if self.qweight is None:
            self._allocate(weight)
        stored_rows = slice(row_offset, row_offset + rows)
        for name, tensor in weight.tensors().items():
            stored = getattr(self, name)
            stored[stored_rows] = tensor.to(stored.device)
        self.loaded_rows.append((stored_rows.start, stored_rows.stop))

    def _load_row_block(self, weight: torch.Tensor | PackedWeight, row_offset: int) -> None:
        if self.row_blocks is None:
            # The first part stored differently: the rows loaded so far become blocks of their own.
            self.row_blocks = nn.ModuleList()
            if self.qweight is not None:
                held = self.weight
                for start, stop in _runs(self.loaded_rows):
                    self._add_row_block(held.rows(slice(start, stop)), start)
                self.qweight = self.scales = self.offsets = None
            self.kind, self.group_size = "mixed", 0
        self._add_row_block(weight, row_offset)

    def _add_row_block(self, weight: torch.Tensor | PackedWeight, row_offset: int) -> None:
        if isinstance(weight, PackedWeight):
            block = QuantizedLinear(self.in_features, weight.out_features, False, self.method, self._device)
        else:
            block = make_linear(self.in_features, weight.shape[0], False, "none", self._device, self._dtype)
        block.load(weight)
        index = bisect(self.row_starts, row_offset)
        self.row_starts.insert(index, row_offset)
        self.row_blocks.insert(index, block)

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
        if self.row_blocks is not None:
            return  # each row block is a QuantizedLinear of its own, packed as the model's modules are
        packed = cpu_packed_weight(self.weight)
        if packed is not None:
            self.cpu_weight = packed
            self.qweight = self.scales = self.offsets = None

    def pack_for_gpu(self) -> None:
        """Once every row is loaded (and, under tensor parallelism, sliced): re-lay the weight for
        the CUDA kernels that read it (gpu_packed.py); the buffers it came from are dropped."""
        # Triton is imported here, on CUDA only, so that the CPU path never loads it.
        if self.row_blocks is not None:
            return  # each row block is a QuantizedLinear of its own, packed as the model's modules are
        from pagoda_runtime.executor.quantization.gpu_packed import gpu_packed_weight

        self.gpu_weight = gpu_packed_weight(self.weight)
        self.qweight = self.scales = self.offsets = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The model's activations are already [tokens, features]: skipping the reshapes and the
        # packed weight's module call saves dispatch time that rivals the matmul's own at batch 1.
        x2d = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.row_blocks is not None:
            y = torch.cat([block(x2d) for block in self.row_blocks], dim=-1)
        elif self.cpu_weight is not None:
            y = self.cpu_weight.forward(x2d)
        elif self.gpu_weight is not None:
            y = self.gpu_weight.forward(x2d)
        else:
            y = reference_matmul(x2d, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}"


def _runs(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Row ranges with the adjacent ones joined."""
    runs: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if runs and runs[-1][1] == start:
            start = runs.pop()[0]
        runs.append((start, stop))
    return runs


def _layout(weight: PackedWeight) -> tuple:
    """What must agree for two parts to share one matrix (and so one kernel)."""
    offsets = None if weight.offsets is None else weight.offsets.dtype
    return weight.kind, weight.group_size, weight.qweight.dtype, weight.scales.dtype, offsets


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The tensor-core kernel takes 16-bit weights; float32 ones stay with cuBLAS.
        if x.is_cuda and x.dim() == 2 and x.dtype == self.weight.dtype != torch.float32:
            from pagoda_runtime.executor.quantization import dispatch

            n, k = self.weight.shape
            plan = dispatch.route("dense", x.shape[0], n, k)
            if plan.path == "mma":
                from pagoda_runtime.executor.quantization.triton_mma import dense_mma_weight, mma_matmul

                y = mma_matmul(x, dense_mma_weight(self.weight), plan.config)
                return y if self.bias is None else y + self.bias
        return super().forward(x)


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
        in_features, out_features, bias, "none" if method in _AS_STORED else method, device, dtype, input_part
    )
