"""A LoRA adapter going into a device slot, as rank 0 sends it to the other ranks of the group
(step_broadcast.py carries it between steps, under the same lock, so every rank puts it in the slot
before the step that reads it).

The whole adapter goes, as the checkpoint holds it: each rank cuts its own shard (lora_layers.py's
slot_weights), as it cut its part of the base weights. Two tensors, nothing pickled: an int64 index
with one row (layer, module, rank, in features, out features) per trained projection, and float32
values, the adapter's scaling then every A and B flattened in the index's order. float32 holds
bfloat16 and float16 weights exactly; slot_weights rounds them to the model's dtype on every rank
alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from pagoda_runtime.loading.lora_adapter import LORA_TARGETS

AdapterWeights = Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LoraLoad:
    slot: int
    scaling: float
    # (layer, module) -> (A [r, in], B [out, r]) in host memory: as read on rank 0, float32 as received.
    weights: AdapterWeights


def pack(load: LoraLoad, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(index int64 [n, 5], values float32) on `device`, the group backend's."""
    keys = sorted(load.weights)
    rows = []
    values = [torch.tensor([load.scaling], dtype=torch.float32)]
    for layer, module in keys:
        a, b = load.weights[(layer, module)]
        rows.append([layer, LORA_TARGETS.index(module), a.shape[0], a.shape[1], b.shape[0]])
        values += [a.reshape(-1).float(), b.reshape(-1).float()]
    index = torch.tensor(rows, dtype=torch.int64).reshape(-1, 5)
    return index.to(device), torch.cat(values).to(device)


def num_values(index: torch.Tensor) -> int:
    """The length of the values tensor that goes with `index`."""
    rank, fan_in, fan_out = index[:, 2], index[:, 3], index[:, 4]
    return 1 + int((rank * (fan_in + fan_out)).sum())


def unpack(slot: int, index: torch.Tensor, values: torch.Tensor) -> LoraLoad:
    index, values = index.cpu(), values.cpu()
    weights = {}
    offset = 1
    for layer, module, rank, fan_in, fan_out in index.tolist():
        a = values[offset : offset + rank * fan_in].reshape(rank, fan_in)
        offset += rank * fan_in
        b = values[offset : offset + fan_out * rank].reshape(fan_out, rank)
        offset += fan_out * rank
        weights[(layer, LORA_TARGETS[module])] = (a, b)
    return LoraLoad(slot, float(values[0]), weights)
