"""Quality of each quantization variant on the bundled model: perplexity, top-1 agreement, mean KL.

The engine scores tests/data/eval_text.txt in one prefill per variant (scoring.score): the float32
reference (the bundled GGUF dequantized) and each variant, each with the bytes its weights occupy
beside sizing.py's prediction. Prints the Markdown table for BENCHMARKS.md.

    PYTHONPATH=runtime python benchmarks/quant_quality.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagoda_runtime.quantization.quality import compare, perplexity  # noqa: E402

from tests.runtime.quantization.bundled_variants import REFERENCE, VARIANTS, score_eval_text  # noqa: E402

MIB = 2**20


def main() -> None:
    reference = score_eval_text(REFERENCE)
    ref_ppl = perplexity(reference.logits, reference.token_ids)
    print(f"bundled smollm2-135m, {len(reference.token_ids)} tokens of tests/data/eval_text.txt\n")
    print(
        "| variant | perplexity | vs reference | top-1 agreement | mean KL (nats) "
        "| weights MiB (sizing) | KV bytes/block |"
    )
    print("|---|---|---|---|---|---|---|")
    memory = reference.memory
    print(
        f"| {REFERENCE.name} | {ref_ppl:.2f} | | | | {memory.weight_bytes / MIB:.1f} "
        f"({memory.predicted_weight_bytes / MIB:.1f}) | {memory.kv_bytes_per_block} |"
    )
    for variant in VARIANTS:
        scored = score_eval_text(variant)
        r = compare(reference.logits, scored.logits, scored.token_ids)
        memory = scored.memory
        print(
            f"| {variant.name} | {r.perplexity:.2f} | {r.perplexity / ref_ppl - 1:+.1%} "
            f"| {r.top1_agreement:.1%} | {r.mean_kl:.4f} | {memory.weight_bytes / MIB:.1f} "
            f"({memory.predicted_weight_bytes / MIB:.1f}) | {memory.kv_bytes_per_block} |"
        )


if __name__ == "__main__":
    main()
