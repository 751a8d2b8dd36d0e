"""What a served model occupies: its weights as measured beside sizing.py's prediction, and its KV cache.

The engine logs it once at start-up and the server returns it from GET /v1/info, so an operator can
check the sizing that admitted a variant against what the pod really holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIB = 2**20


@dataclass(frozen=True)
class MemoryReport:
    model: str  # the --model the engine loaded
    quantization: str  # the method the projections are held in (never "auto")
    dtype: str  # of the unquantized weights and the activations
    kv_cache_dtype: str  # "fp8", or the model's dtype
    weight_bytes: int  # measured: every tensor the checkpoint filled, as stored
    predicted_weight_bytes: int  # sizing.weight_bytes for this architecture, quantization and dtype
    kv_bytes_per_block: int  # all layers, keys and values
    block_size: int  # tokens per block
    num_kv_blocks: int  # of the full-attention layers (of every layer when no window is shorter)
    # What every layer's cache occupies: sliding-window layers with a pool of their own hold fewer
    # blocks than num_kv_blocks (sizing.kv_pools); None: kv_bytes_per_block x num_kv_blocks.
    kv_cache_bytes: int | None = None
    # A draft model's (speculative decoding): its weights and its own KV cache, reported alike.
    draft: MemoryReport | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_bytes is None:
            object.__setattr__(self, "kv_cache_bytes", self.kv_bytes_per_block * self.num_kv_blocks)

    def to_json(self) -> dict:
        report = asdict(self)
        if self.draft is None:
            del report["draft"]
        return report

    def describe(self) -> str:
        return (
            f"{self.model}: quantization {self.quantization}, weights {self.weight_bytes / MIB:.1f} MiB "
            f"({self.weight_bytes} bytes; sizing predicts {self.predicted_weight_bytes}); KV cache "
            f"{self.kv_cache_dtype}, {self.kv_bytes_per_block} bytes per block of {self.block_size} tokens, "
            f"{self.num_kv_blocks} blocks ({self.kv_cache_bytes / MIB:.1f} MiB)"
            + ("" if self.draft is None else f"; draft model {self.draft.describe()}")
        )
