"""`pagoda-runtime serve` (the OpenAI-compatible server), `pagoda-runtime fetch` (the model cache's
download Job), `pagoda-runtime inspect` (the sizing Job of a pvc:// model) and
`pagoda-runtime bench ...` (benchmarks)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pagoda_runtime.bench.workload import OFFLINE_ENGINE_FLAGS, OFFLINE_QUANTIZATION
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.flags import add_flags, from_args
from pagoda_runtime.contract.names import API_KEY_ENV, HTTP_PORT
from pagoda_runtime.contract.serve_settings import DistributedSettings, ServerSettings
from pagoda_runtime.parallel.world_layout import WorldLayout, world_layout


def _add_serve(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (docs/architecture.md#cli).",
    )
    engine = p.add_argument_group("engine")
    add_flags(engine, EngineConfig)
    # Only where --model comes from, as vllm serve's: not an engine setting, so not in EngineConfig.
    engine.add_argument(
        "--revision", default=None, help="the commit, branch or tag of a hub id --model (default: main)"
    )
    add_flags(p.add_argument_group("server"), ServerSettings)
    add_flags(p.add_argument_group("parallelism across processes and pods"), DistributedSettings)


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True)
    p = bench.add_parser("serve", help="load-test a running server (vLLM benchmark_serving style)")
    p.add_argument("--base-url", default=f"http://127.0.0.1:{HTTP_PORT}")
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
    add_flags(p, EngineConfig, OFFLINE_ENGINE_FLAGS, quantization=OFFLINE_QUANTIZATION)
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

    config = offline.OfflineConfig(from_args(EngineConfig, args, model=args.shape), hf=args.hf)
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
    return from_args(EngineConfig, args)


def layout(args: argparse.Namespace, env=None) -> WorldLayout:
    """Raises world_layout.LayoutError, whose message says what to change."""
    return world_layout(args.tensor_parallel_size, args.distributed_port, args.distributed_timeout, env)


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else the environment's; surrounding whitespace dropped, since a Secret written from
    a file usually ends in a newline that no client sends (nor could, in a header)."""
    return (args.api_key or os.environ.get(API_KEY_ENV) or "").strip() or None


def server_settings(args: argparse.Namespace) -> ServerSettings:
    return from_args(
        ServerSettings,
        args,
        served_model_names=tuple(args.served_model_names or [args.model]),
        api_key=api_key(args),
        max_num_seqs=args.max_num_seqs,
    )


def _serve(args: argparse.Namespace) -> int:
    from pagoda_runtime.contract.bundled import BUNDLED_MODEL_NAME
    from pagoda_runtime.contract.model_catalogue import SHAPES, shape_config
    from pagoda_runtime.loading.model_cache.hub import hub_model, is_hub_id
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
    elif is_hub_id(args.model):
        try:
            local = hub_model(args.model, args.revision)
        except Exception as exc:  # the hub's own reason: unknown repo, gated, offline without a copy
            return refuse(
                f"downloading {args.model} from the Hugging Face hub failed: {type(exc).__name__}: {exc}"
            )
        # Served under the hub id, as vLLM does, from the snapshot in the cache.
        args.served_model_names = args.served_model_names or [args.model.split("@", 1)[0]]
        args.model = str(local)
    try:
        config = engine_config(args)
        settings = server_settings(args)
    except ValueError as exc:  # flags that do not go together; the message says which
        return refuse(str(exc))
    if not world.is_group:
        return serve(engine_loader(config), settings, settings.host, settings.port, termination_log)
    from pagoda_runtime.parallel.rank_group import LogSettings, RankGroup
    from pagoda_runtime.parallel.rank_worker import serve_worker_node

    group = RankGroup(world, config, LogSettings(args.log_format, args.log_level.upper()), termination_log)
    if not world.is_leader:
        return serve_worker_node(group)
    return group.finish(
        serve(group_engine_loader(group), settings, settings.host, settings.port, termination_log)
    )


def _add_fetch(sub) -> None:
    p = sub.add_parser("fetch", help="download a model revision into a cache folder, once")
    p.add_argument("source", help="hf://org/name or s3://bucket/prefix (with --adapter, also a folder)")
    p.add_argument("--revision", default=None, help="commit id of an hf:// model")
    p.add_argument(
        "--allow-pattern",
        action="append",
        default=[],
        help="of an hf:// repository, only files matching this fnmatch pattern (repeatable)",
    )
    p.add_argument(
        "--ignore-pattern",
        action="append",
        default=[],
        help="of an hf:// repository, leave out files matching this fnmatch pattern (repeatable)",
    )
    p.add_argument("--cache-dir", required=True, help="the cache folder (the model lands in CACHE_DIR/model)")
    p.add_argument(
        "--adapter",
        action="store_true",
        help="the source is a PEFT LoRA adapter (its adapter_config.json and adapter_model.safetensors, "
        "checked and reported by its rank): hf://, s3://, or a mounted folder to copy",
    )
    p.add_argument("--termination-log", default=None, help="file for the outcome line (default: as serve)")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")


def _fetch(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from pagoda_runtime.contract.sources import parse_remote
    from pagoda_runtime.loading.model_cache.adapter import ADAPTER, copy_adapter
    from pagoda_runtime.loading.model_cache.fetch import MODEL, fetch, termination_summary
    from pagoda_runtime.termination import default_termination_log, write_termination_message

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    termination_log = args.termination_log or default_termination_log()
    try:
        if args.adapter and not args.source.startswith(("hf://", "s3://")):
            manifest = copy_adapter(Path(args.source), Path(args.cache_dir))
        else:
            if args.adapter:
                from pagoda_runtime.loading.lora_source import adapter_source

                if args.allow_pattern or args.ignore_pattern:
                    raise ValueError(
                        "--adapter fetches the adapter's two files; drop the allow and ignore patterns"
                    )
                source, contents = adapter_source(args.source, args.revision), ADAPTER
            else:
                patterns = (tuple(args.allow_pattern), tuple(args.ignore_pattern))
                source, contents = parse_remote(args.source, args.revision, *patterns), MODEL
            manifest = fetch(
                source,
                Path(args.cache_dir),
                emit=lambda line: print(line, flush=True),
                progress_interval=args.progress_interval,
                contents=contents,
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
        api_key=api_key(args),
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
