"""A GGUF (v2/v3) reader: metadata, tensor infos and memory-mapped tensor data, with dequantization.

Layout (little-endian): magic "GGUF", version u32, tensor count u64, metadata count u64, the
metadata key/values, the tensor infos (name, dims innermost-first, ggml type, offset), then, at the
next multiple of `general.alignment`, the tensor data. `raw_bytes` hands out a tensor's stored
blocks untouched, so quantized weights can later be used without dequantizing them. The block
types themselves are quantization/gguf_block_layouts.py's; a tensor of a type Pagoda cannot read
fails the opening of the file, before anything is allocated for the model.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pagoda_runtime.executor.quantization.gguf_block_layouts import (
    BLOCK_LAYOUT,
    GGMLType,
    dequantize_blocks,
    type_name,
    unsupported_type_message,
)

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    pass


# GGUF metadata value types: scalar ones map to a struct format.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING = 8
_ARRAY = 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # PyTorch order: outermost first (GGUF stores dims innermost first)
    ggml_type: int
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    def __init__(self, buffer: mmap.mmap | bytes, path: Path) -> None:
        self.buffer = buffer
        self.path = path
        self.pos = 0

    def take(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if end > len(self.buffer):
            raise GGUFError(
                f"{self.path} is truncated: expected {what} at byte {self.pos} but the file ends at byte "
                f"{len(self.buffer)}; download the file again"
            )
        view = memoryview(self.buffer)[self.pos : end]
        self.pos = end
        return view

    def scalar(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("Q", what)
        return bytes(self.take(length, what)).decode("utf-8", errors="replace")

    def value(self, value_type: int, what: str) -> Any:
        if value_type in _SCALARS:
            return self.scalar(_SCALARS[value_type], what)
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY:
            item_type = self.scalar("I", what)
            count = self.scalar("Q", what)
            if item_type in _NUMPY:
                dtype = np.dtype(_NUMPY[item_type])
                return np.frombuffer(self.take(count * dtype.itemsize, what), dtype=dtype).tolist()
            return [self.value(item_type, what) for _ in range(count)]
        raise GGUFError(
            f"{self.path} has metadata {what} of unknown value type {value_type}; the file is corrupt"
        )


class GGUFFile:
    """An open GGUF file. Tensor data stays in the page cache until a tensor is read."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                raise GGUFError(f"{self.path} is empty; expected a GGUF file")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cursor = _Cursor(self._map, self.path)
        magic = bytes(cursor.take(4, "the 4-byte GGUF magic"))
        if magic != _MAGIC:
            raise GGUFError(f"{self.path} is not a GGUF file: it starts with {magic!r} instead of {_MAGIC!r}")
        self.version = cursor.scalar("I", "the GGUF version")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path} is GGUF version {self.version}; Pagoda reads versions 2 and 3")
        tensor_count = cursor.scalar("Q", "the tensor count")
        metadata_count = cursor.scalar("Q", "the metadata count")
        self.metadata: dict[str, Any] = {}
        for i in range(metadata_count):
            key = cursor.string(f"metadata key #{i}")
            value_type = cursor.scalar("I", f"the type of metadata {key!r}")
            self.metadata[key] = cursor.value(value_type, f"metadata {key!r}")
        raw_infos = []
        for i in range(tensor_count):
            name = cursor.string(f"tensor info #{i}")
            n_dims = cursor.scalar("I", f"the rank of tensor {name!r}")
            dims = [cursor.scalar("Q", f"the shape of tensor {name!r}") for _ in range(n_dims)]
            ggml_type = cursor.scalar("I", f"the type of tensor {name!r}")
            offset = cursor.scalar("Q", f"the offset of tensor {name!r}")
            raw_infos.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-cursor.pos // alignment) * alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, shape, ggml_type, offset in raw_infos:
            info = GGUFTensorInfo(
                name, shape, ggml_type, data_start + offset, self._nbytes(name, shape, ggml_type)
            )
            if info.offset + info.nbytes > size:
                raise GGUFError(
                    f"{self.path} is truncated: tensor {name!r} needs bytes "
                    f"{info.offset}..{info.offset + info.nbytes} "
                    f"but the file ends at byte {size}; download the file again"
                )
            self.tensors[name] = info

    def _nbytes(self, name: str, shape: tuple[int, ...], ggml_type: int) -> int:
        if ggml_type not in BLOCK_LAYOUT:
            raise GGUFError(f"{self.path}: tensor {name!r} has {unsupported_type_message(ggml_type)}")
        block_elements, block_bytes = BLOCK_LAYOUT[GGMLType(ggml_type)]
        if shape and shape[-1] % block_elements:
            raise GGUFError(
                f"{self.path}: tensor {name!r} has rows of {shape[-1]} elements, not a multiple of the "
                f"{block_elements}-element blocks of {type_name(ggml_type)}; the file is corrupt"
            )
        return int(np.prod(shape, dtype=np.int64)) // block_elements * block_bytes

    def raw_bytes(self, name: str) -> np.ndarray:
        """The tensor's stored bytes as a read-only uint8 array over the memory map (no copy)."""
        info = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def dequantize(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        values = dequantize(self.raw_bytes(name), info.ggml_type)
        return values.reshape(info.shape)


def dequantize(raw: np.ndarray, ggml_type: int) -> torch.Tensor:
    """Stored bytes of one ggml type -> a flat float32 tensor (a fresh copy, never a view of `raw`)."""
    return torch.from_numpy(dequantize_blocks(raw, ggml_type))
