"""Cold start, measured in its two parts: filling the model cache, and the runtime's start-up.

    PYTHONPATH=runtime:operator:. python benchmarks/cold_start.py \
        --size-gb 2 --out benchmarks/results/cpu/cold_start.json

1. A synthetic Llama-shaped checkpoint of about --size-gb GB (bf16 safetensors, 1 GB shards, random
   weights, a small real tokenizer) is written to a temporary folder.
2. `fetch` downloads it into a fresh cache folder from a loopback hub mirror (huggingface_hub)
   and from a loopback MinIO (the MinIO client): bytes/s including the hash checks and the
   checkpoint's sizing read; the same code the download Job runs.
3. A fresh process loads the cached checkpoint, and the bundled model, on the CPU: seconds from
   process start (imports included) to an engine ready to serve, the weight-loading rate, and
   the peak anonymous memory next to the weight bytes (no second full host copy: loading streams
   one tensor at a time).
4. A second replica's scheduled→Ready, with the cache = its load time (the cache is already
   complete); without it = a download of its own + its load time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def load_child(model: str) -> None:
    """Runs in a fresh process: prints the start-up figures as one JSON line."""
    started = time.monotonic()
    import threading

    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], _rss_anon_kib())

    threading.Thread(target=sample, daemon=True).start()
    from pagoda_runtime.contract.config import EngineConfig
    from pagoda_runtime.engine.llm_engine import LLMEngine
    from pagoda_runtime.loading.load_progress import LOAD_PROGRESS

    imported = time.monotonic()
    baseline = _rss_anon_kib()
    weights = {}

    def on_weights_done(snapshot) -> None:
        weights.update(seconds=snapshot.seconds, bytes=snapshot.bytes, tensors=snapshot.tensors)

    original_phase = LOAD_PROGRESS.phase

    def phase(name: str) -> None:
        if name == "allocating the KV cache":
            on_weights_done(LOAD_PROGRESS.snapshot())
        original_phase(name)

    LOAD_PROGRESS.phase = phase
    dtype = "float32" if model == "smollm2-135m" else "bfloat16"
    engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype=dtype, kv_cache_memory=64 * 2**20))
    ready = time.monotonic()
    stop.set()
    print(
        json.dumps(
            {
                "model": model,
                "dtype": dtype,
                "import_s": round(imported - started, 2),
                "engine_s": round(ready - imported, 2),
                "process_to_engine_s": round(ready - started, 2),
                "weights_s": round(weights["seconds"], 2),
                "weight_bytes": weights["bytes"],
                "weights_gb_per_s": round(weights["bytes"] / weights["seconds"] / 1e9, 3),
                "model_weight_bytes": engine.runner.weight_bytes,
                "peak_rss_anon_bytes": peak[0] * 1024,
                # What loading added to the process: the weights themselves, the KV cache and the
                # largest single tensor in flight; a second full copy would double the first term.
                "load_rss_anon_growth_bytes": (peak[0] - baseline) * 1024,
                "kv_cache_bytes": 64 * 2**20,
            }
        )
    )


def _load(model: str, label: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run(
        [sys.executable, __file__, "--load-child", model], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"model": label}


@dataclass(frozen=True)
class CheckpointShape:
    """A synthetic checkpoint's widths; its layer count follows from the size asked for."""

    hidden: int = 2048
    intermediate: int = 8192
    heads: int = 16
    kv_heads: int = 4
    vocab: int = 32768


def write_checkpoint(folder: Path, size_gb: float, shape: CheckpointShape = CheckpointShape()) -> dict:
    import torch
    from safetensors.torch import save_file

    from tests.runtime.tiny_models import build_tiny_model

    tiny = build_tiny_model(folder.parent / "tokenizer-source", "llama3")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, folder / name)
    hidden, inter, heads, kv_heads, vocab = (
        shape.hidden,
        shape.intermediate,
        shape.heads,
        shape.kv_heads,
        shape.vocab,
    )
    head_dim = hidden // heads
    per_layer = 2 * (hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter + 2 * hidden)
    layers = max(1, int((size_gb * 1e9 - 4 * vocab * hidden) // per_layer))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "eos_token_id": json.loads((tiny / "config.json").read_text())["eos_token_id"],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    generator = torch.Generator().manual_seed(0)

    def tensor(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    kv = kv_heads * head_dim
    tensors = {
        "model.embed_tokens.weight": tensor(vocab, hidden),
        "lm_head.weight": tensor(vocab, hidden),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": tensor(hidden, hidden),
            p + "self_attn.k_proj.weight": tensor(kv, hidden),
            p + "self_attn.v_proj.weight": tensor(kv, hidden),
            p + "self_attn.o_proj.weight": tensor(hidden, hidden),
            p + "mlp.gate_proj.weight": tensor(inter, hidden),
            p + "mlp.up_proj.weight": tensor(inter, hidden),
            p + "mlp.down_proj.weight": tensor(hidden, inter),
        }
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        current[name] = t
        size += t.numel() * 2
        if size >= 1e9:
            shards.append(current)
            current, size = {}, 0
    if current:
        shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    total = sum(p.stat().st_size for p in folder.iterdir())
    return {"layers": layers, "files": len(list(folder.iterdir())), "bytes": total, "config": config}


def _fetch_timed(source, cache: Path) -> dict:
    from pagoda_runtime.loading.model_cache.fetch import fetch

    started = time.monotonic()
    manifest = fetch(source, cache, emit=lambda _: None)
    seconds = time.monotonic() - started
    return {
        "seconds": round(seconds, 2),
        "bytes": manifest["bytes"],
        "mb_per_s": round(manifest["bytes"] / seconds / 1e6, 1),
    }


def download(folder: Path, work: Path) -> dict:
    from pagoda_runtime.contract.sources import HubSource, S3Source
    from tests.model_cache.hub_mirror import HubMirror
    from tests.model_cache.minio_server import ACCESS_KEY, SECRET_KEY, MinioServer

    results = {}
    commit = "c" * 40
    with HubMirror() as hub:
        hub.add("bench/synthetic", folder, commit)
        os.environ["HF_ENDPOINT"] = hub.url
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        results["hf_mirror"] = _fetch_timed(HubSource("bench/synthetic", commit), work / "cache-hf")
    with MinioServer(work / "minio-data") as server:
        client = server.client()
        client.make_bucket("models")
        for path in sorted(folder.iterdir()):
            client.fput_object("models", f"synthetic/{path.name}", str(path))
        os.environ |= {
            "AWS_ENDPOINT_URL": server.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }
        results["s3_minio"] = _fetch_timed(S3Source("models", "synthetic"), work / "cache-s3")
    shutil.rmtree(work / "minio-data", ignore_errors=True)
    shutil.rmtree(work / "cache-s3", ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu/cold_start.json")
    parser.add_argument("--load-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_child:
        load_child(args.load_child)
        return 0
    with tempfile.TemporaryDirectory(prefix="pagoda-cold-start-") as tmp:
        work = Path(tmp)
        folder = work / "synthetic"
        folder.mkdir()
        checkpoint = write_checkpoint(folder, args.size_gb)
        downloads = download(folder, work)
        cached = work / "cache-hf" / "model"
        load_synthetic = _load(str(cached), "the synthetic checkpoint, from the cache")
        load_bundled = _load("smollm2-135m", "smollm2-135m")
    with_cache = load_synthetic["process_to_engine_s"]
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "device": f"CPU, {os.cpu_count()} cores (shared)",
        "command": "PYTHONPATH=runtime:operator:. python benchmarks/cold_start.py "
        f"--size-gb {args.size_gb:g}",
        "checkpoint": checkpoint,
        "download": downloads,
        "load": {"synthetic": load_synthetic, "bundled": load_bundled},
        "second_replica_scheduled_to_engine_s": {
            "with_cache": with_cache,
            "without_cache_hf_mirror": round(downloads["hf_mirror"]["seconds"] + with_cache, 2),
            "without_cache_s3_minio": round(downloads["s3_minio"]["seconds"] + with_cache, 2),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
