"""The bundled SmolLM2-135M served by the engine in each quantization variant, scoring the committed text.

The reference is the bundled Q4_1 file dequantized to float32 ("none"); every variant is the same
file through the engine's own loader, model and kernels, with float32 activations (on the CPU, or
on the GPU through the compiled Triton kernels).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch
from pagoda_runtime.config import EngineConfig
from pagoda_runtime.engine import LLMEngine
from pagoda_runtime.memory_report import MemoryReport
from pagoda_runtime.scoring import score

EVAL_TEXT = Path(__file__).parents[2] / "data" / "eval_text.txt"
# Enough KV blocks for the evaluation text, a small fraction of the CPU default.
KV_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Variant:
    name: str
    quantization: str
    kv_cache_dtype: str = "auto"


REFERENCE = Variant("float32 reference", "none")
VARIANTS = [
    Variant("int8", "int8"),
    Variant("fp8", "fp8"),
    Variant("int4", "int4"),
    Variant("gguf (Q4_1 kept as int4)", "gguf"),
    Variant("fp8 KV cache", "none", "fp8"),
]


@dataclass(frozen=True)
class Scored:
    logits: torch.Tensor  # [T, V], row i predicts token i + 1
    token_ids: torch.Tensor  # [T]
    memory: MemoryReport


def score_eval_text(variant: Variant, device: str = "cpu") -> Scored:
    """Build the variant's engine, score the evaluation text in one prefill, and let the engine go."""
    config = EngineConfig(
        model="smollm2-135m",
        dtype="float32",
        device=device,
        quantization=variant.quantization,
        kv_cache_dtype=variant.kv_cache_dtype,
        kv_cache_memory=KV_CACHE_BYTES,
    )
    engine = LLMEngine(config)
    token_ids = engine.tokenizer.encode(EVAL_TEXT.read_text(), add_special_tokens=False)
    scored = Scored(score(engine, token_ids).cpu(), torch.tensor(token_ids), engine.memory)
    del engine
    gc.collect()
    return scored
