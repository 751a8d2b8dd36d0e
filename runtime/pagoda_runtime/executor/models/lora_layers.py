"""LoRA on a built model: every decoder layer's qkv_proj, o_proj, gate_up_proj and down_proj gets the
stacked adapter slots the batched kernel reads (kernels/lora.py, laid out as kernels/lora_weights.py
says), and adds each token's adapter delta to the base projection's output, whatever the base
weights are held in (dense or quantized: the delta is computed from the activations).

`attach_lora` adds them; `LoraSlots` is what the step and the adapter manager see: the step's
token grouping (`batch`, None when no token of the step has an adapter, and then LoRA costs
nothing), every slot's scaling, and `slot_weights` / `load_slot` to turn an adapter into this
rank's slot tensors in host memory and to copy them into a device slot.

Hugging Face's q/k/v and gate/up adapters map onto the parts of the fused projections; under tensor
parallelism each rank keeps the rows of B its column-parallel base keeps (q, k, v, gate, up) and
the columns of A its row-parallel base reads (o, down), and the rotary row order of a partial
rotary model applies to the B rows of q and k as it does to their base weights. A mixture-of-
experts layer's MLP takes no adapter (only its attention does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from pagoda_runtime.executor.kernels.lora import add_lora
from pagoda_runtime.executor.kernels.lora_slots import LoraBatch
from pagoda_runtime.executor.kernels.lora_weights import stack_lora_weights
from pagoda_runtime.executor.models.layers import Attention, GatedMLP

# The fused projection's attribute -> the Hugging Face modules of its output parts, in order.
_PARTS = {
    # A gated attention's qkv_proj ends with the gate's rows, which no adapter trains (q_gate).
    "qkv_proj": ("q_proj", "k_proj", "v_proj", "q_gate"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
_ROW_PARALLEL = ("o_proj", "down_proj")


class LoraSlots:
    """The adapter slots of a model: shared by all its LoraProjections."""

    def __init__(self, num_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.dtype = dtype
        self.scaling = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.batch: LoraBatch | None = None  # the running step's tokens by slot
        self.projections: list[LoraProjection] = []
        self.model: nn.Module | None = None

    @property
    def sharded(self) -> bool:
        """Whether the model is one rank's part of a tensor-parallel group."""
        return self.model.tp.size > 1

    def slot_weights(
        self, name: str, adapter: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """An adapter's (layer, Hugging Face module) -> (A [r, in], B [out, r]) as this rank's tensors
        of one slot, one (A [parts, R, in], B [out, R]) per projection in `projections` order, in
        host memory (pinned where a GPU copies from it). ValueError for a module the model cannot
        take an adapter on."""
        model = self.model
        layers_with_mlp = {p.layer for p in self.projections if p.attribute in ("gate_up_proj", "down_proj")}
        for layer, module in adapter:
            if module in ("gate_proj", "up_proj", "down_proj") and layer not in layers_with_mlp:
                raise ValueError(
                    f"LoRA adapter {name!r} trains layer {layer}'s {module}, but that layer's MLP (a mixture "
                    "of experts, or an ungated MLP) takes no adapter; train the adapter on attention only"
                )
        fused = model._fused_parts()
        tp = model.tp
        arch = model.config.architecture
        pinned = self.scaling.device.type == "cuda"
        out = []
        for proj in self.projections:
            parts = []
            for module in _PARTS[proj.attribute][: len(proj.output_slices)]:
                weights = adapter.get((proj.layer, module))
                if weights is None:
                    parts.append(None)
                    continue
                a, b = weights
                if module in ("q_proj", "k_proj") and model._rotary_rows is not None:
                    b = model._rotary_order(b)
                if module in fused:
                    b = b[fused[module][2]]
                elif tp.size > 1:
                    whole = arch.q_size if module == "o_proj" else arch.intermediate_size
                    a = a[:, tp.part(whole, module)]
                parts.append((a, b))
            lora_a, lora_b = stack_lora_weights(
                [parts], proj.in_features, proj.output_slices, self.max_rank, self.dtype
            )
            lora_a, lora_b = lora_a[:, 0].contiguous(), lora_b[0].contiguous()
            if pinned:
                lora_a, lora_b = lora_a.pin_memory(), lora_b.pin_memory()
            out.append((lora_a, lora_b))
        return out

    def load_slot(
        self, slot: int, weights: Sequence[tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> None:
        """Copy an adapter's slot tensors (slot_weights) into device slot `slot`. Ordered on the
        device after every step launched before, so a step still running keeps what it read."""
        for proj, (lora_a, lora_b) in zip(self.projections, weights, strict=True):
            # Part by part: each is one contiguous block of the slot layout, a single copy.
            for part in range(lora_a.shape[0]):
                proj.lora_a[part, slot].copy_(lora_a[part], non_blocking=True)
            proj.lora_b[slot].copy_(lora_b, non_blocking=True)
        self.scaling[slot] = scaling


class LoraProjection(nn.Module):
    """One projection's slots: lora_a [parts, S, R, in], lora_b [S, out, R]."""

    def __init__(
        self,
        slots: LoraSlots,
        layer: int,
        attribute: str,
        in_features: int,
        output_slices: tuple[int, ...],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.slots = slots
        self.layer = layer
        self.attribute = attribute
        self.in_features = in_features
        self.output_slices = output_slices
        shape_a = (len(output_slices), slots.num_slots, slots.max_rank, in_features)
        self.register_buffer(
            "lora_a", torch.zeros(shape_a, dtype=slots.dtype, device=device), persistent=False
        )
        shape_b = (slots.num_slots, sum(output_slices), slots.max_rank)
        self.register_buffer(
            "lora_b", torch.zeros(shape_b, dtype=slots.dtype, device=device), persistent=False
        )

    def forward(self, base_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        batch = self.slots.batch
        if batch is None:
            return base_out
        return add_lora(base_out, x, batch, self.lora_a, self.lora_b, self.slots.scaling, self.output_slices)


def attach_lora(model: nn.Module, num_slots: int, max_rank: int, dtype: torch.dtype) -> LoraSlots:
    """Give every decoder layer's projections `num_slots` adapter slots of rank up to `max_rank`,
    held in the activation dtype."""
    device = model.cos_sin_cache.device
    slots = LoraSlots(num_slots, max_rank, device, dtype)
    slots.model = model
    hidden = model.config.architecture.hidden_size
    for i, layer in enumerate(model.layers):
        # A hybrid's recurrent layers (and Nemotron-H's MLP layers) have no attention to adapt.
        attn = getattr(layer, "self_attn", None)
        if attn is not None and not isinstance(attn, Attention):
            raise ValueError(
                f"LoRA adapters are not served on {model.config.model_type} models (layer {i}'s attention "
                "is not one LoRA reaches); serve this model without --enable-lora"
            )
        if attn is not None:
            kv = attn.kv_size
            slices = (attn.q_size, kv, kv) + ((attn.gate_size,) if attn.gate_size else ())
            _attach(attn, "qkv_proj", LoraProjection(slots, i, "qkv_proj", hidden, slices, device))
            _attach(attn, "o_proj", LoraProjection(slots, i, "o_proj", attn.q_size, (hidden,), device))
        if isinstance(getattr(layer, "mlp", None), GatedMLP):
            channels = layer.mlp.channels
            mlp = layer.mlp
            _attach(
                mlp,
                "gate_up_proj",
                LoraProjection(slots, i, "gate_up_proj", hidden, (channels, channels), device),
            )
            _attach(mlp, "down_proj", LoraProjection(slots, i, "down_proj", channels, (hidden,), device))
    slots.projections = [m for m in model.modules() if isinstance(m, LoraProjection)]
    return slots


def _attach(owner: nn.Module, attribute: str, projection: LoraProjection) -> None:
    setattr(owner, attribute.removesuffix("_proj") + "_lora", projection)
