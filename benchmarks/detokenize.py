"""What streaming text costs the engine's host per step: the incremental detokenizer, per token.

A serving step hands every running sequence's new token to its detokenizer (detokenizer.py); at
256 sequences that is 256 calls in the step's host time. This streams the first tokens of the
committed evaluation text through 256 detokenizers of the bundled model's tokenizer, token by
token as the engine does, without and with a stop string (which adds the stop matching).

    .venv/bin/python -m benchmarks.detokenize --result-json benchmarks/results/cpu/detokenize.json
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import UTC, datetime

from benchmarks.quant_quality import EVAL_TEXT
from pagoda_runtime.bench.results import emit
from pagoda_runtime.contract.bundled import bundled_model_path
from pagoda_runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.loading.gguf_reader import GGUFFile

SEQUENCES = 256
PROMPT = 5


def seconds_per_token(tokenizer: Tokenizer, ids: list[int], stop: list[str]) -> float:
    """Seconds per token of streaming ids[PROMPT:] through SEQUENCES detokenizers, one step at a time."""
    detokenizers = [IncrementalDetokenizer(tokenizer, ids[:PROMPT], stop=stop) for _ in range(SEQUENCES)]
    started = time.perf_counter()
    for token in ids[PROMPT:]:
        for detokenizer in detokenizers:
            detokenizer.add_tokens([token])
    return (time.perf_counter() - started) / (SEQUENCES * (len(ids) - PROMPT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=400, help="tokens of the evaluation text streamed")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each case; the median is kept")
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args(argv)
    path = bundled_model_path()
    tokenizer = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, str(path))
    ids = tokenizer.encode(EVAL_TEXT.read_text())[: args.tokens]
    rows = []
    for name, stop in (("no stop string", []), ("one stop string", ["\n\n\n"])):
        per_token = statistics.median(seconds_per_token(tokenizer, ids, stop) for _ in range(args.rounds))
        rows.append(
            {
                "case": name,
                "us_per_token": per_token * 1e6,
                "ms_per_step_at_256": per_token * SEQUENCES * 1e3,
            }
        )
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "tokenizer": path.name,
        "sequences": SEQUENCES,
        "tokens": len(ids) - PROMPT,
        "rounds": args.rounds,
        "rows": rows,
    }
    emit(result, args.result_json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
