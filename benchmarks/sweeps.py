"""Throughput against batch size, latency against request rate, speed against weight quantization:
a JSON table and a PNG plot each.

    .venv/bin/python -m benchmarks.sweeps batch --shape llama-3-8b --out benchmarks/results/h100
    .venv/bin/python -m benchmarks.sweeps rate --serve "--model llama-3-8b --load-format dummy" \
        --rates 4,8,16,32,64,inf --num-prompts 400 --out benchmarks/results/h100
    .venv/bin/python -m benchmarks.sweeps quant --shape llama-3-8b \
        --quantizations none,int8,fp8,int4 --batch-size 1 --out benchmarks/results/h100

`batch` runs `bench latency` once per batch size (fixed input and output lengths, ignore_eos) on
a random-weight model of a named shape; `rate` runs `bench serve` once per Poisson rate, lowest
first, against a server that is already up (--base-url) or one it starts and stops itself
(--serve, launched_server.py), and says from which rate output throughput stops growing; `quant`
runs `bench latency` once per weight quantization, one after the other in one process (each
engine's memory freed before the next is built), and gives each variant's decode tok/s against
the first's, with the report's roofline figures as it gives them.
A variant that cannot run on this device or shape gets a row saying why instead of a speed. Each
writes its table as JSON beside the plot, so a figure in BENCHMARKS.md can be traced to the
numbers under it.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from pagoda_runtime.bench.workload import OFFLINE_QUANTIZATION
from pagoda_runtime.contract.config import QUANTIZATION_CHOICES, EngineConfig
from pagoda_runtime.contract.flags import add_flags, from_args

# The engine flags of the batch and quant sweeps, as `serve` declares them (EngineConfig).
_ENGINE_FLAGS = ("device", "dtype", "kv_cache_memory")
# Results of `bench latency` that belong to its roofline (the measured bandwidth and matmul peak,
# the bytes read, the bound and the fraction of it): the quant table passes them on as they are.
ROOFLINE_WORDS = ("roofline", "bandwidth", "peak", "bytes")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def batch_sweep(args: argparse.Namespace) -> dict:
    from pagoda_runtime.bench import offline

    rows = []
    for batch in [int(b) for b in _floats(args.batch_sizes)]:
        config = offline.OfflineConfig(
            from_args(EngineConfig, args, model=args.shape, max_num_seqs=max(batch, 1)), hf=args.hf
        )
        report = offline.latency(config, batch, args.input_len, args.output_len)
        results = report.results
        rows.append(
            {
                "batch": batch,
                "output_tok_per_s": results["output_tok_per_s"],
                "decode_tok_per_s": results["decode_tok_per_s"],
                "tpot_p50_s": results["tpot_s"]["p50"],
                "hf_output_tok_per_s": results.get("hf_output_tok_per_s"),
            }
        )
        print(f"batch {batch:>4}: {results['decode_tok_per_s']:.1f} decode tok/s", flush=True)
    return {
        "kind": "batch",
        "shape": args.shape,
        "device": report.device,
        "dtype": report.dtype,
        "quantization": args.quantization,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "rows": rows,
    }


def _quantizations(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in QUANTIZATION_CHOICES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown quantization {', '.join(unknown)}; use names from {', '.join(QUANTIZATION_CHOICES)}"
        )
    return names


def _is_roofline_figure(key: str) -> bool:
    return any(word in key for word in ROOFLINE_WORDS)


def quant_sweep(args: argparse.Namespace) -> dict:
    import gc

    import torch

    from pagoda_runtime.bench import offline
    from pagoda_runtime.executor.devices import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    rows = []
    for quantization in args.quantizations:
        config = offline.OfflineConfig(
            from_args(
                EngineConfig, args, model=args.shape, quantization=quantization, max_num_seqs=args.batch_size
            )
        )
        try:
            results = offline.latency(config, args.batch_size, args.input_len, args.output_len).results
        except (ValueError, RuntimeError) as exc:  # a variant this device or shape cannot run
            rows.append({"quantization": quantization, "skipped": str(exc)})
            print(f"{quantization:>6}: skipped, {exc}", flush=True)
        else:
            rows.append(
                {
                    "quantization": quantization,
                    "decode_tok_per_s": results["decode_tok_per_s"],
                    "tpot_p50_s": results["tpot_s"]["p50"],
                    **{k: v for k, v in results.items() if _is_roofline_figure(k)},
                }
            )
            print(f"{quantization:>6}: {results['decode_tok_per_s']:.1f} decode tok/s", flush=True)
        finally:
            # The next variant's weights need the memory this one's engine held.
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    baseline = rows[0].get("decode_tok_per_s")
    for row in rows:
        rate = row.get("decode_tok_per_s")
        row["speedup"] = rate / baseline if rate and baseline else None
    return {
        "kind": "quant",
        "shape": args.shape,
        "device": str(device),
        "dtype": str(resolve_dtype(args.dtype, device)),
        "batch": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "baseline": rows[0]["quantization"],
        "rows": rows,
    }


# Throughput counts as saturated from the lowest rate that reaches this share of the highest
# measured: past it, more offered load buys at most this much more output.
SATURATED = 0.95


def _rate_name(rate: float) -> float | str:
    """JSON has no Infinity; an unlimited rate is written as it is given on the command line."""
    return "inf" if math.isinf(rate) else rate


def _run_rates(args: argparse.Namespace, base_url: str) -> tuple[str, list[dict]]:
    """The served model's name, and one row per rate, lowest first."""
    from pagoda_runtime.bench.serve import BenchConfig, run

    rows = []
    for rate in sorted(_floats(args.rates)):
        result_json = Path(args.out) / f"serve-rate-{rate:g}.json"
        code = run(
            BenchConfig(
                base_url=base_url,
                num_prompts=args.num_prompts,
                request_rate=rate,
                input_len=args.input_len,
                output_len=args.output_len,
                vocab_size=args.random_vocab_size,
                seed=args.seed,
                api_key=args.api_key,
                result_json=str(result_json),
            )
        )
        summary = json.loads(result_json.read_text())
        if code:
            raise SystemExit(f"{summary['failed']} requests failed at {rate:g} req/s: {summary['errors']}")
        rows.append(
            {
                "rate": _rate_name(rate),
                "request_throughput": summary["request_throughput"],
                "output_tok_per_s": summary["output_throughput"],
                **{f"{m}_{p}_s": summary[f"{m}_s"][p] for m in ("ttft", "tpot") for p in ("p50", "p95")},
            }
        )
    return summary["model"], rows


def saturation(rows: list[dict]) -> dict:
    """Where output throughput stops growing: the lowest rate within SATURATED of the highest
    measured (`rate`), or None when that is the highest rate swept, which only bounds it."""
    best = max(r["output_tok_per_s"] for r in rows)
    knee = next(i for i, r in enumerate(rows) if r["output_tok_per_s"] >= SATURATED * best)
    rate = rows[knee]["rate"]
    if knee < len(rows) - 1:
        verdict = (
            f"output throughput stops growing at {rate} req/s: {rows[knee]['output_tok_per_s']:.1f} tok/s, "
            f"within {1 - SATURATED:.0%} of the highest measured ({best:.1f} tok/s)"
        )
        return {"rate": rate, "output_tok_per_s": best, "verdict": verdict}
    if len(rows) == 1:
        verdict = "one rate only: sweep several to see where output throughput stops growing"
    elif rate == "inf":
        verdict = (
            f"output throughput still grew from {rows[-2]['rate']} req/s to an unlimited rate "
            f"({best:.1f} tok/s): it saturates between them; add rates in that range"
        )
    else:
        verdict = (
            f"output throughput still grew up to {rate} req/s ({best:.1f} tok/s): add higher rates or inf"
        )
    return {"rate": None, "output_tok_per_s": best, "verdict": verdict}


def rate_sweep(args: argparse.Namespace) -> dict:
    from benchmarks.launched_server import launched_server

    if args.serve is None:
        model, rows = _run_rates(args, args.base_url)
    else:
        log_path = Path(args.out) / "server.log"
        with launched_server(shlex.split(args.serve), log_path, args.ready_timeout) as base_url:
            model, rows = _run_rates(args, base_url)
    table = {
        "kind": "rate",
        "model": model,
        "serve": args.serve,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "rows": rows,
        "saturation": saturation(rows),
    }
    print(table["saturation"]["verdict"], flush=True)
    return table


def plot_batch(table: dict, path: Path) -> None:
    plt = _pyplot()
    rows = table["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    batches = [r["batch"] for r in rows]
    ax.plot(batches, [r["decode_tok_per_s"] for r in rows], "o-", label="Pagoda, decode")
    ax.plot(batches, [r["output_tok_per_s"] for r in rows], "o:", label="Pagoda, prefill included")
    hf = [r for r in rows if r["hf_output_tok_per_s"]]
    if hf:
        ax.plot(
            [r["batch"] for r in hf],
            [r["hf_output_tok_per_s"] for r in hf],
            "s--",
            label="transformers generate, prefill included",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("output tok/s")
    ax.set_title(
        f"{table['shape']} {table['quantization']}, {table['device']} "
        f"{table['dtype'].removeprefix('torch.')}, in {table['input_len']} / out {table['output_len']}",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_rate(table: dict, path: Path) -> None:
    plt = _pyplot()
    rows = table["rows"]
    # Evenly spaced rates, labelled as given, so that an unlimited rate has its place at the end.
    at = range(len(rows))
    labels = [f"{r['rate']:g}" if isinstance(r["rate"], float | int) else str(r["rate"]) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, metric, name in (
        (axes[0], "ttft", "time to first token"),
        (axes[1], "tpot", "time per output token"),
    ):
        for p, style in (("p50", "o-"), ("p95", "s--")):
            ax.plot(at, [r[f"{metric}_{p}_s"] * 1000 for r in rows], style, label=p)
        ax.set_ylabel(f"{name} (ms)")
        ax.legend()
    axes[2].plot(at, [r["output_tok_per_s"] for r in rows], "o-", label="output tok/s")
    saturated = [i for i, r in enumerate(rows) if r["rate"] == table["saturation"]["rate"]]
    if saturated:
        axes[2].axvline(
            saturated[0], color="grey", linestyle=":", label=f"saturated ({SATURATED:.0%} of the highest)"
        )
    axes[2].set_ylabel("output throughput (tok/s)")
    axes[2].legend()
    for ax in axes:
        ax.set_xticks(list(at), labels)
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(
        f"{table['model']}: {table['num_prompts']} requests per rate, in {table['input_len']} / "
        f"out {table['output_len']} tokens",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_quant(table: dict, path: Path) -> None:
    plt = _pyplot()
    rows = table["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [r["quantization"] for r in rows]
    rates = [r.get("decode_tok_per_s", 0.0) for r in rows]
    bars = ax.bar(names, rates)
    for bar, row in zip(bars, rows, strict=True):
        label = f"{row['speedup']:.2f}x" if row["speedup"] is not None else "skipped"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    ax.set_xlabel(f"weights (speedup against {table['baseline']})")
    ax.set_ylabel("decode tok/s")
    ax.set_title(
        f"{table['shape']}, {table['device']} {table['dtype'].removeprefix('torch.')}, "
        f"batch {table['batch']}, in {table['input_len']} / out {table['output_len']}",
        fontsize=9,
    )
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("matplotlib is missing; install the dev extra: pip install -c constraints.txt -e '.[dev]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="sweep", required=True)
    batch = sub.add_parser("batch", help="decode tok/s against batch size, random weights of a named shape")
    batch.add_argument("--shape", default="llama-3-8b")
    batch.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    add_flags(batch, EngineConfig, (*_ENGINE_FLAGS, "quantization"), quantization=OFFLINE_QUANTIZATION)
    batch.add_argument("--input-len", type=int, default=128)
    batch.add_argument("--output-len", type=int, default=128)
    batch.add_argument("--hf", action="store_true", help="transformers' generate at each batch size too")
    rate = sub.add_parser("rate", help="TTFT and TPOT percentiles against Poisson request rate")
    server = rate.add_mutually_exclusive_group(required=True)
    server.add_argument("--base-url", help="a server that is already up")
    server.add_argument(
        "--serve",
        metavar="FLAGS",
        help="start `pagoda-runtime serve FLAGS` on a free loopback port for the sweep, stop it with "
        "SIGTERM after, and fail unless it exits 0 (e.g. '--model llama-3-8b --load-format dummy')",
    )
    rate.add_argument(
        "--ready-timeout", type=float, default=600.0, help="seconds --serve's server may take to get ready"
    )
    rate.add_argument(
        "--rates",
        default="1,2,4,8,inf",
        help="Poisson request rates (req/s); inf sends every request at once, the saturation point",
    )
    rate.add_argument("--num-prompts", type=int, default=200)
    rate.add_argument("--input-len", type=int, default=128)
    rate.add_argument("--output-len", type=int, default=128)
    rate.add_argument(
        "--random-vocab-size", type=int, default=8000, help="prompt token ids are drawn below this"
    )
    rate.add_argument("--seed", type=int, default=0)
    rate.add_argument("--api-key", default=None)
    quant = sub.add_parser(
        "quant", help="decode tok/s of each weight quantization against the first, one run"
    )
    quant.add_argument("--shape", default="llama-3-8b")
    quant.add_argument(
        "--quantizations", type=_quantizations, default="none,int8,fp8,int4", help="the first is the baseline"
    )
    quant.add_argument("--batch-size", type=int, default=1)
    add_flags(quant, EngineConfig, _ENGINE_FLAGS)
    quant.add_argument("--input-len", type=int, default=128)
    quant.add_argument("--output-len", type=int, default=128)
    for p in (batch, rate, quant):
        p.add_argument("--out", required=True, help="folder for the JSON table and the PNG plot")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sweep == "batch":
        table, name, plot = batch_sweep(args), "throughput_vs_batch", plot_batch
    elif args.sweep == "quant":
        table, name, plot = quant_sweep(args), "quantization_speed", plot_quant
    else:
        table, name, plot = rate_sweep(args), "latency_vs_rate", plot_rate
    (out / f"{name}.json").write_text(json.dumps(table, indent=2))
    plot(table, out / f"{name}.png")
    print(f"wrote {out / name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
