"""`pagoda-runtime serve` (the OpenAI-compatible server), `pagoda-runtime fetch` (the model cache's
download Job), `pagoda-runtime inspect` (the sizing Job of a pvc:// model) and
`pagoda-runtime bench ...` (benchmarks)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pagoda_runtime.contract.config import KV_CACHE_DTYPES, LOAD_FORMATS, QUANTIZATION_CHOICES, EngineConfig
from pagoda_runtime.parallel.world_layout import (
    DEFAULT_DISTRIBUTED_PORT,
    DEFAULT_DISTRIBUTED_TIMEOUT_S,
    LWS_VARIABLES,
    WorldLayout,
    world_layout,
)
from pagoda_runtime.server.metrics_compat import METRICS_COMPAT_CHOICES
from pagoda_runtime.server.tool_parsers import TOOL_CALL_PARSERS

API_KEY_ENV = "PAGODA_API_KEY"


def _names(value: str) -> list[str]:
    """A list flag as vLLM takes it (a JSON list) or comma-separated."""
    if value.lstrip().startswith("["):
        try:
            names = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from exc
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise argparse.ArgumentTypeError("give a JSON list of strings")
        return names
    return [name.strip() for name in value.split(",") if name.strip()]


def _chat_template(value: str | None) -> str | None:
    """--chat-template: a file's contents, or the template itself (as vLLM reads it)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return path.read_text() if path.is_file() else value


def _pipeline_parallel_size(value: str) -> int:
    if value.strip() != "1":
        raise argparse.ArgumentTypeError(
            f"{value} is not supported: Pagoda splits a model over GPUs and nodes by tensor parallelism "
            "only, so give the total GPU count as --tensor-parallel-size and leave this at 1"
        )
    return 1


def _add_parallel(p) -> None:
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        help="ranks (GPUs) the model is split over, one process each; under LeaderWorkerSet "
        f"({', '.join(LWS_VARIABLES)} set) they span the group's pods, N / LWS_GROUP_SIZE per pod",
    )
    p.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=_pipeline_parallel_size,
        default=1,
        help="accepted for vLLM's command lines; only 1 (docs/architecture.md#multi-process-and-multi-node)",
    )
    p.add_argument(
        "--distributed-port",
        type=int,
        default=DEFAULT_DISTRIBUTED_PORT,
        help="TCP port where the ranks meet on the leader (LWS_LEADER_ADDRESS, or this machine)",
    )
    p.add_argument(
        "--distributed-timeout",
        type=float,
        default=DEFAULT_DISTRIBUTED_TIMEOUT_S,
        help="seconds a rank waits for the others (to join, to load, within a step) before the "
        "process exits non-zero",
    )


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    defaults = EngineConfig()
    p.add_argument(
        "--model",
        default=defaults.model,
        help="model folder, .gguf file, or 'smollm2-135m'; with --load-format dummy a model shape",
    )
    p.add_argument(
        "--load-format",
        default=defaults.load_format,
        choices=LOAD_FORMATS,
        help="auto: read the checkpoint --model names; dummy: random weights of the model shape --model "
        "names (llama-3-8b, tiny-llama, ...: model_catalogue.py) with a bare tokenizer, for benchmarks",
    )
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the names clients may use; the first one labels the metrics (default: --model)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template, or a file holding one, to use instead of the model's own",
    )
    p.add_argument(
        "--tool-call-parser",
        default="hermes",
        choices=TOOL_CALL_PARSERS,
        help="how tool calls are found in the text for tool_choice auto: hermes (<tool_call> JSON, "
        "Qwen2.5/SmolLM/Hermes) or llama3_json (Llama 3.x)",
    )
    p.add_argument(
        "--allowed-origins",
        type=_names,
        default=[],
        help="CORS origins allowed, as a JSON list or comma-separated (e.g. '[\"*\"]'); default: no CORS",
    )
    p.add_argument("--allowed-methods", type=_names, default=["*"], help="CORS methods allowed")
    p.add_argument("--allowed-headers", type=_names, default=["*"], help="CORS headers allowed")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    p.add_argument(
        "--metrics-compat",
        choices=METRICS_COMPAT_CHOICES,
        default=None,
        help="also export the metrics under vLLM's names (vllm:num_requests_waiting, ...) for existing "
        "dashboards and autoscaling rules",
    )
    p.add_argument("--dtype", default=defaults.dtype, choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--device", default=defaults.device, help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--quantization",
        default=defaults.quantization,
        choices=QUANTIZATION_CHOICES,
        help="how to hold the projections; auto serves the checkpoint as it was saved "
        "(what it picks: docs/architecture.md#quantization)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default=defaults.kv_cache_dtype,
        choices=KV_CACHE_DTYPES,
        help="auto: the model's dtype; fp8: e4m3 with a per-tensor scale of 1.0, half the bytes of bf16",
    )
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    p.add_argument("--block-size", type=int, default=defaults.block_size)
    p.add_argument(
        "--kv-cache-memory",
        type=float,
        default=defaults.kv_cache_memory,
        help="KV cache size in bytes, or a fraction (0, 1] of free device memory",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM's budget instead of --kv-cache-memory: the fraction (0, 1] of the GPU's total memory "
        "for this process; the KV cache gets what the weights leave of it",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_prefix_caching,
    )
    p.add_argument("--enforce-eager", action="store_true", help="do not capture CUDA graphs")
    add_async_scheduling_flag(p)
    _add_parallel(p)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="accepted requests waiting beyond a full batch (--max-num-seqs) after which new ones get 429 "
        "with Retry-After (default: twice --max-num-seqs)",
    )
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="seconds to finish requests after SIGTERM"
    )
    p.add_argument("--canary-interval", type=float, default=10.0, help="seconds between readiness canaries")
    p.add_argument(
        "--termination-log",
        default=None,
        help="file for a fatal start-up error (default: /dev/termination-log when writable)",
    )
    p.add_argument("--api-key", default=None, help=f"require this bearer key on /v1/* (or set {API_KEY_ENV})")
    p.add_argument("--log-format", choices=["text", "json"], default="text")
    p.add_argument("--log-level", default="INFO")


def add_async_scheduling_flag(p) -> None:
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule and launch each step before reading the previous step's tokens, and make their "
        "text while the device runs (default: on a GPU; a CPU computes in the launch, so it gains nothing)",
    )
    p.add_argument(
        "--disable-async-output-proc",
        action="store_true",
        help="vLLM's older switch, kept: the same as --no-async-scheduling",
    )


def async_scheduling(args: argparse.Namespace) -> bool | None:
    """The EngineConfig value of --[no-]async-scheduling and --disable-async-output-proc: on, off,
    or the device's default."""
    return False if args.disable_async_output_proc else args.async_scheduling


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True)
    p = bench.add_parser("serve", help="load-test a running server (vLLM benchmark_serving style)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name (default: the server's only model)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson arrivals")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument(
        "--random-vocab-size", type=int, default=8000, help="prompt token ids are drawn below this"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--result-json", default=None, help="write the results here as JSON")
    _add_offline_bench(bench)


def _add_offline_common(p) -> None:
    p.add_argument(
        "--shape",
        default="llama-3-8b",
        help="llama-3-8b, llama-3.2-1b, qwen2.5-7b, smollm2-135m or tiny-llama",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--quantization", default="none")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-memory", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true")
    add_async_scheduling_flag(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf", action="store_true", help="also run transformers' generate and report the ratio")
    p.add_argument("--result-json", default=None)


def _add_offline_bench(bench) -> None:
    p = bench.add_parser("throughput", help="offline throughput on a random-weight model of a named shape")
    _add_offline_common(p)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt and output")
    p.add_argument("--max-len", type=int, default=1024, help="longest prompt and output")
    p.add_argument(
        "--temperature", type=float, default=0.6, help="sampling temperature (nano-vllm's 0.6; 0: greedy)"
    )
    p.add_argument(
        "--hf-num-prompts",
        type=int,
        default=64,
        help="how many of the workload's requests, from the first, the transformers run covers "
        "(--num-prompts: all of them)",
    )
    p.add_argument("--hf-batch-size", type=int, default=64)
    p = bench.add_parser("latency", help="TTFT/TPOT/ITL and the roofline at a fixed batch, greedy")
    _add_offline_common(p)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)


def _bench_offline(args: argparse.Namespace) -> int:
    from pagoda_runtime.bench import offline

    config = offline.OfflineConfig(
        shape=args.shape,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory=args.kv_cache_memory,
        enforce_eager=args.enforce_eager,
        async_scheduling=async_scheduling(args),
        seed=args.seed,
        hf=args.hf,
    )
    try:
        if args.bench_command == "throughput":
            report = offline.throughput(
                config,
                args.num_prompts,
                args.min_len,
                args.max_len,
                args.hf_num_prompts,
                args.hf_batch_size,
                args.temperature,
            )
        else:
            report = offline.latency(config, args.batch_size, args.input_len, args.output_len)
    except ValueError as exc:  # a shape, device or option this run cannot take; the message says which
        print(f"pagoda-runtime bench {args.bench_command}: {exc}", file=sys.stderr)
        return 2
    return offline.finish(report, args.result_json)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        load_format=args.load_format,
        dtype=args.dtype,
        device=args.device,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=args.enforce_eager,
        async_scheduling=async_scheduling(args),
        seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
    )


def layout(args: argparse.Namespace, env=None) -> WorldLayout:
    """Raises world_layout.LayoutError, whose message says what to change."""
    return world_layout(args.tensor_parallel_size, args.distributed_port, args.distributed_timeout, env)


def server_settings(args: argparse.Namespace):
    from pagoda_runtime.server.state import ServerSettings

    names = args.served_model_name or [args.model]
    return ServerSettings(
        served_model_name=names[0],
        served_model_aliases=tuple(names[1:]),
        tool_call_parser=args.tool_call_parser,
        chat_template=_chat_template(args.chat_template),
        allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods),
        allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
        metrics_compat=args.metrics_compat,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        drain_timeout=args.drain_timeout,
        canary_interval=args.canary_interval,
    )


def _serve(args: argparse.Namespace) -> int:
    from pagoda_runtime.contract.bundled import BUNDLED_MODEL_NAME
    from pagoda_runtime.contract.model_catalogue import SHAPES, shape_config
    from pagoda_runtime.logs import configure_logging
    from pagoda_runtime.parallel.world_layout import LayoutError
    from pagoda_runtime.server.process import engine_loader, group_engine_loader, serve
    from pagoda_runtime.termination import default_termination_log, write_termination_message

    configure_logging(args.log_format, args.log_level.upper())
    termination_log = args.termination_log or default_termination_log()

    def refuse(message: str) -> int:
        print(f"pagoda-runtime serve: {message}", file=sys.stderr, flush=True)
        write_termination_message(termination_log, message)
        return 1

    try:
        world = layout(args)
    except LayoutError as exc:
        return refuse(str(exc))
    if args.load_format == "dummy":
        try:
            shape_config(args.model)
        except ValueError as exc:
            return refuse(f"--load-format dummy: {exc}")
    elif args.model in SHAPES and args.model != BUNDLED_MODEL_NAME and not Path(args.model).exists():
        return refuse(
            f"{args.model!r} names a model shape, not a checkpoint: add --load-format dummy to serve "
            "random weights of it, or give the checkpoint's folder or .gguf file"
        )
    config = engine_config(args)
    settings = server_settings(args)
    if not world.is_group:
        return serve(engine_loader(config), settings, args.host, args.port, termination_log)
    from pagoda_runtime.parallel.rank_group import LogSettings, RankGroup
    from pagoda_runtime.parallel.rank_worker import serve_worker_node

    group = RankGroup(world, config, LogSettings(args.log_format, args.log_level.upper()), termination_log)
    if not world.is_leader:
        return serve_worker_node(group)
    return group.finish(serve(group_engine_loader(group), settings, args.host, args.port, termination_log))


def _add_fetch(sub) -> None:
    p = sub.add_parser("fetch", help="download a model revision into a cache folder, once")
    p.add_argument("source", help="hf://org/name or s3://bucket/prefix")
    p.add_argument("--revision", default=None, help="commit id of an hf:// model")
    p.add_argument("--cache-dir", required=True, help="the cache folder (the model lands in CACHE_DIR/model)")
    p.add_argument("--termination-log", default=None, help="file for the outcome line (default: as serve)")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")


def _fetch(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from pagoda_runtime.contract.sources import parse_remote
    from pagoda_runtime.loading.model_cache.fetch import fetch, termination_summary
    from pagoda_runtime.termination import default_termination_log, write_termination_message

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    termination_log = args.termination_log or default_termination_log()
    try:
        source = parse_remote(args.source, args.revision)
        manifest = fetch(
            source,
            Path(args.cache_dir),
            emit=lambda line: print(line, flush=True),
            progress_interval=args.progress_interval,
        )
    except Exception as exc:  # every failure ends the Job with its one-line reason for the operator
        message = f"downloading {args.source} failed: {type(exc).__name__}: {exc}".replace("\n", " ")
        print(message, file=sys.stderr, flush=True)
        write_termination_message(termination_log, message)
        return 1
    write_termination_message(termination_log, termination_summary(manifest))
    print(f"{args.source} is cached in {args.cache_dir}", flush=True)
    return 0


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="read a checkpoint's shape (config.json / GGUF metadata) for sizing")
    p.add_argument("model", help="a model folder or a .gguf file, as serve's --model")
    p.add_argument("--termination-log", default=None, help="file for the outcome line (default: as serve)")


def _inspect(args: argparse.Namespace) -> int:
    """The sizing Job of a pvc:// model: the facts the download Job reports, without a download."""
    from pagoda_runtime.contract.bundled import resolve_model
    from pagoda_runtime.loading.model_cache.architecture import facts_line
    from pagoda_runtime.termination import default_termination_log, write_termination_message

    termination_log = args.termination_log or default_termination_log()
    try:
        line = facts_line(resolve_model(args.model))
    except Exception as exc:  # every failure ends the Job with its one-line reason for the operator
        message = f"reading the checkpoint {args.model} failed: {type(exc).__name__}: {exc}"
        message = message.replace("\n", " ")
        print(message, file=sys.stderr, flush=True)
        write_termination_message(termination_log, message)
        return 1
    write_termination_message(termination_log, line)
    print(line, flush=True)
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from pagoda_runtime.bench.serve import BenchConfig, run

    config = BenchConfig(
        base_url=args.base_url,
        model=args.model,
        num_prompts=args.num_prompts,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        input_len=args.random_input_len,
        output_len=args.random_output_len,
        vocab_size=args.random_vocab_size,
        seed=args.seed,
        api_key=args.api_key or os.environ.get(API_KEY_ENV),
        result_json=args.result_json,
    )
    return run(config)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pagoda-runtime")
    sub = top.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_fetch(sub)
    _add_inspect(sub)
    _add_bench(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "fetch":
        return _fetch(args)
    if args.command == "inspect":
        return _inspect(args)
    if args.bench_command == "serve":
        return _bench_serve(args)
    return _bench_offline(args)


if __name__ == "__main__":
    sys.exit(main())
