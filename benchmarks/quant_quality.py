"""Quality of each quantization variant of the bundled SmolLM2-135M: perplexity, top-1 agreement and
mean KL against the reference, and the weight bytes each holds beside sizing.py's prediction.

The engine scores a committed English text (pagoda_runtime/data/eval_text.txt) in one prefill per
variant (scoring.score). The reference is the bundled Q4_1 file dequantized to float32 ("none");
every variant is the same file through the engine's own loader, model and kernels, with float32
activations (on the CPU, or on the GPU through the compiled Triton kernels). The tests hold each
variant to a bound with the same functions.

    .venv/bin/python -m benchmarks.quant_quality \
        --result-json benchmarks/results/cpu/quant_quality.json
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass
from pathlib import Path

import torch

import pagoda_runtime
from pagoda_runtime.bench.results import emit
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.memory_report import MemoryReport
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.quantization.quality import compare, perplexity

EVAL_TEXT = Path(pagoda_runtime.__file__).parent / "data" / "eval_text.txt"
# Enough KV blocks for the evaluation text, a small fraction of the CPU default.
KV_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Variant:
    name: str
    quantization: str
    kv_cache_dtype: str = "auto"
    dtype: str = "float32"


REFERENCE = Variant("float32 reference", "none")
VARIANTS = [
    Variant("int8", "int8"),
    Variant("fp8", "fp8"),
    Variant("int4", "int4"),
    Variant("gguf (Q4_1 kept as int4)", "gguf"),
    Variant("fp8 KV cache", "none", "fp8"),
    # What `--dtype auto` serves on the CPU: the file's int4 blocks in torch's packed CPU matmul
    # with bfloat16 activations around it, and a float16 embedding and LM head (float32 logits).
    Variant("gguf, --dtype auto", "gguf", dtype="auto"),
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
        dtype=variant.dtype,
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


def measure(device: str = "cpu") -> dict:
    """The reference and every variant, as one JSON-ready table."""
    reference = score_eval_text(REFERENCE, device)
    ref_ppl = perplexity(reference.logits, reference.token_ids)
    rows = [{"variant": REFERENCE.name, "perplexity": ref_ppl, **_memory(reference.memory)}]
    for variant in VARIANTS:
        scored = score_eval_text(variant, device)
        quality = compare(reference.logits, scored.logits, scored.token_ids)
        rows.append(
            {
                "variant": variant.name,
                "perplexity": quality.perplexity,
                "perplexity_vs_reference": quality.perplexity / ref_ppl - 1,
                "top1_agreement": quality.top1_agreement,
                "mean_kl": quality.mean_kl,
                **_memory(scored.memory),
            }
        )
    return {"model": "smollm2-135m", "device": device, "tokens": len(reference.token_ids), "rows": rows}


def _memory(memory: MemoryReport) -> dict:
    return {
        "weight_bytes": memory.weight_bytes,
        "predicted_weight_bytes": memory.predicted_weight_bytes,
        "kv_bytes_per_block": memory.kv_bytes_per_block,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--result-json", default=None, help="write the table here as JSON")
    args = parser.parse_args(argv)
    result = measure(args.device)
    emit(result, args.result_json)


if __name__ == "__main__":
    main()
