"""Quality of each quantization variant on the bundled model: perplexity, top-1 agreement, mean KL.

Scores tests/data/eval_text.txt with the float32 reference (the bundled GGUF dequantized) and with
every variant, and prints the Markdown table for BENCHMARKS.md. Until the engine's model can score
a text, the model is Hugging Face's LlamaForCausalLM with its projections swapped for ours.

    PYTHONPATH=runtime python benchmarks/quant_quality.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagoda_runtime.quantization.quality import compare, perplexity  # noqa: E402

from tests.runtime.quantization.hf_llama import (  # noqa: E402
    bundled_hf_llama,
    load_gguf_projections,
    next_token_logits,
    quantize_projections,
)


def main() -> None:
    torch.manual_seed(0)
    model, token_ids = bundled_hf_llama()
    targets = torch.tensor(token_ids)
    reference = next_token_logits(model, token_ids)
    print(f"bundled smollm2-135m, {len(token_ids)} tokens of tests/data/eval_text.txt\n")
    print("| variant | perplexity | vs reference | top-1 agreement | mean KL (nats) |")
    print("|---|---|---|---|---|")
    ref_ppl = perplexity(reference, targets)
    print(f"| float32 reference | {ref_ppl:.2f} | | | |")
    variants = [(m, lambda q, m=m: quantize_projections(q, m)) for m in ("int8", "fp8", "int4")]
    variants.append(("gguf (Q4_1 kept as int4)", load_gguf_projections))
    for name, build in variants:
        quantized = copy.deepcopy(model)
        build(quantized)
        r = compare(reference, next_token_logits(quantized, token_ids), targets)
        change = r.perplexity / ref_ppl - 1
        print(f"| {name} | {r.perplexity:.2f} | {change:+.1%} | {r.top1_agreement:.1%} | {r.mean_kl:.4f} |")


if __name__ == "__main__":
    main()
