"""Per-step cost of structured output: what the grammar mask adds to one sampling step.

Replays a JSON document that a schema accepts, token by token, through llguidance matchers over
the bundled model's vocabulary (49,152 tokens), and times each step's mask exactly as the sampler
runs it (grammar_mask.GrammarMasker: the batch bitmask filled in parallel, copied once, applied
with one masked_fill) beside the same step with no constrained sequence. The model's forward is
left out: it is the same with and without a grammar, and on a shared CPU it would drown the
difference. With --compare-xgrammar (xgrammar importable), the per-token mask cost and the
schema coverage of xgrammar are measured beside llguidance's, which is how the engine was chosen.

    .venv/bin/python -m benchmarks.structured_output \
        --out benchmarks/results/cpu/structured_output.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import llguidance
import torch

from pagoda_runtime.contract.bundled import bundled_model_path
from pagoda_runtime.engine.grammar_mask import GrammarCompiler, GrammarMasker, advance
from pagoda_runtime.engine.structured_outputs import StructuredOutputError, StructuredOutputs
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.loading.gguf_reader import GGUFFile

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "email", "tags", "address"],
    "additionalProperties": False,
}
DOCUMENT = (
    '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["admin", "user"], '
    '"address": {"city": "London", "zip": "12345"}}'
)
# Keywords a user's schema may carry; an engine that compiles one it cannot enforce drops it silently.
COVERAGE = {
    "properties/required": SCHEMA,
    "$ref/$defs": {"$defs": {"p": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/p"}},
    "recursive $ref": {
        "$defs": {
            "n": {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}
        },
        "$ref": "#/$defs/n",
    },
    "anyOf": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
    "pattern": {"type": "string", "pattern": "^[a-z]{3}$"},
    "format": {"type": "string", "format": "date"},
    "minimum/maximum": {"type": "integer", "minimum": 1, "maximum": 9},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    "not": {"not": {"type": "string"}},
    "if/then": {"if": {"type": "string"}, "then": {"minLength": 1}},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
}


def _stats(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
        "p50_us": round(ordered[len(ordered) // 2] * 1e6, 1),
        "p90_us": round(ordered[int(len(ordered) * 0.9)] * 1e6, 1),
    }


def mask_steps(compiler, tokens, vocab, batch, constrained, rounds) -> dict:
    """One sampling step's mask for `batch` rows of which `constrained` follow the schema."""
    spec = StructuredOutputs(json=json.dumps(SCHEMA))
    masker = GrammarMasker(torch.device("cpu"))
    logits = torch.randn(batch, vocab)
    seqs = [SimpleNamespace(grammar=None) for _ in range(batch)]
    mask_s, advance_s = [], []
    for _ in range(rounds):
        matchers = compiler.matchers(spec, constrained) if constrained else []
        for seq, matcher in zip(seqs, matchers, strict=False):
            seq.grammar = matcher
        for token in tokens:
            step_logits = logits.clone()
            started = time.perf_counter()
            masked = masker(step_logits, seqs)
            mask_s.append(time.perf_counter() - started)
            assert masked[0, token] == logits[0, token], "the document left the grammar"
            started = time.perf_counter()
            for seq in seqs:
                advance(seq, token)
            advance_s.append(time.perf_counter() - started)
    return {
        "batch": batch,
        "constrained": constrained,
        "steps": len(mask_s),
        "mask": _stats(mask_s),
        "advance_all_rows": _stats(advance_s),
    }


def llguidance_per_token(compiler, tokens, vocab) -> dict:
    tokenizer = compiler._lltokenizer
    grammar = StructuredOutputs(json=json.dumps(SCHEMA)).to_llguidance()
    started = time.perf_counter()
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    compile_s = time.perf_counter() - started
    mask = torch.empty(1, (vocab + 31) // 32, dtype=torch.int32)
    samples = []
    for token in tokens:
        started = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        samples.append(time.perf_counter() - started)
        matcher.consume_token(token)
    coverage = {}
    for name, schema in COVERAGE.items():
        try:
            StructuredOutputs(json=json.dumps(schema)).to_llguidance()
            coverage[name] = "enforced"
        except StructuredOutputError as exc:
            coverage[name] = f"refused: {exc}"
    return {"compile_ms": round(compile_s * 1e3, 2), "mask_per_token": _stats(samples), "coverage": coverage}


def xgrammar_per_token(tokenizer: Tokenizer, tokens, vocab) -> dict:
    import xgrammar

    words = [tokenizer.backend.id_to_token(i) for i in range(tokenizer.vocab_size)]
    info = xgrammar.TokenizerInfo(
        words,
        vocab_type=xgrammar.VocabType.BYTE_LEVEL,
        vocab_size=vocab,
        stop_token_ids=list(tokenizer.eos_token_ids),
    )
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    started = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_s = time.perf_counter() - started
    matcher = xgrammar.GrammarMatcher(compiled)
    mask = xgrammar.allocate_token_bitmask(1, vocab)
    samples = []
    for token in tokens:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        samples.append(time.perf_counter() - started)
        matcher.accept_token(token)
    coverage = {}
    for name, schema in COVERAGE.items():
        try:
            compiler.compile_json_schema(json.dumps(schema))
            coverage[name] = "compiled"
        except Exception as exc:  # xgrammar raises plain RuntimeErrors
            coverage[name] = f"refused: {exc}"
    return {
        "version": importlib.metadata.version("xgrammar"),
        "compile_ms": round(compile_s * 1e3, 2),
        "mask_per_token": _stats(samples),
        "coverage": coverage,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="replays of the document per batch size")
    parser.add_argument("--compare-xgrammar", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_gguf_metadata(GGUFFile(bundled_model_path()).metadata, "bundled")
    vocab = tokenizer.vocab_size
    compiler = GrammarCompiler(tokenizer, vocab, tokenizer.eos_token_ids)
    tokens = tokenizer.encode(DOCUMENT, add_special_tokens=False)
    shapes = [(1, 0), (1, 1), (8, 8), (32, 0), (32, 1), (32, 32), (64, 64)]
    result = {
        "date": date.today().isoformat(),
        "device": f"CPU ({platform.machine()}, {torch.get_num_threads()} torch thread)",
        "llguidance": llguidance.__version__,
        "vocab": vocab,
        "document_tokens": len(tokens),
        "steps": [mask_steps(compiler, tokens, vocab, b, c, args.rounds) for b, c in shapes],
        "llguidance_engine": llguidance_per_token(compiler, tokens, vocab),
    }
    if args.compare_xgrammar:
        result["xgrammar_engine"] = xgrammar_per_token(tokenizer, tokens, vocab)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
