"""`pagoda-runtime fetch`: fill a cache folder with one model revision, once.

Runs in the download Job. Idempotent: a complete cache is left as it is; a partial one resumes.
The files land in `<root>/.partial`, are checked against the sizes and hashes the server announced,
opened as the runtime would open them, and only then renamed to `<root>/model`. What is fetched is
a model unless told otherwise (`Contents`): a LoRA adapter is checked and described by its own
rules (loading/lora_source.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.download_progress import ProgressReporter
from pagoda_runtime.contract.sources import HubSource, RemoteSource, S3Source
from pagoda_runtime.loading.model_cache import hub, s3
from pagoda_runtime.loading.model_cache.architecture import checkpoint_facts
from pagoda_runtime.loading.model_cache.verify import Expected, verify_file

log = logging.getLogger("pagoda.fetch")


def _model_path(source: RemoteSource, folder: Path, files: list[Expected]) -> Path:
    """What the runtime's --model points at inside the model folder: the folder, or its one .gguf."""
    if isinstance(source, S3Source) and source.is_file:
        return folder / files[0].path
    ggufs = [f.path for f in files if f.path.endswith(".gguf")]
    if not (folder / "config.json").is_file() and len(ggufs) == 1:
        return folder / ggufs[0]
    return folder


def _one_model(source: RemoteSource, files: list[Expected]) -> None:
    """Refuses, before any byte is downloaded, a selection the runtime could not open as one model:
    a repository of several GGUF files (one per quantization) and no config.json."""
    ggufs = sorted(f.path for f in files if f.path.endswith(".gguf"))
    if len(ggufs) > 1 and not any(f.path == "config.json" for f in files):
        example = ggufs[0]
        raise ValueError(
            f"{source.uri} holds {len(ggufs)} GGUF files ({', '.join(ggufs[:8])}): name the one to serve, "
            f"as hf://{getattr(source, 'repo', 'org/name')}/{example} or with allowPatterns ['{example}']"
            if isinstance(source, HubSource)
            else f"{source.uri} holds {len(ggufs)} GGUF files ({', '.join(ggufs[:8])}): name the one to "
            "serve, as s3://bucket/path/file.gguf"
        )


@dataclass(frozen=True)
class Contents:
    """What a cache holds: `check` refuses a listing before any byte is downloaded, `facts` describes
    the downloaded files for the manifest (and fails on files the runtime could not open)."""

    check: Callable[[RemoteSource, list[Expected]], None]
    facts: Callable[[Path], dict]


MODEL = Contents(_one_model, checkpoint_facts)


def fetch(
    source: RemoteSource, root: Path, emit=print, progress_interval: float = 5.0, contents: Contents = MODEL
) -> dict:
    """Downloads `source` into `root` unless it is there; returns the manifest."""
    done = layout.read_manifest(root)
    if done is not None:
        log.info("%s is already cached in %s", source.uri, layout.model_dir(root))
        return done
    partial = layout.partial_dir(root)
    partial.mkdir(parents=True, exist_ok=True)
    if isinstance(source, HubSource):
        files = hub.list_files(source)
        contents.check(source, files)
        total = sum(f.size for f in files)
        with ProgressReporter(partial, total, emit, progress_interval):
            hub.download(source, partial)
    else:
        client = s3.client()
        listed = s3.list_files(source, client)
        files = [expected for _, expected, _ in listed]
        contents.check(source, files)
        total = sum(f.size for f in files)
        with ProgressReporter(partial, total, emit, progress_interval):
            s3.download(source, partial, client, listed)
    for expected in files:
        verify_file(partial, expected)
    model_path = _model_path(source, partial, files)
    manifest = {
        "source": source.uri,
        "revision": getattr(source, "revision", None),
        "bytes": total,
        "files": {f.path: f.size for f in files},
        "modelPath": str(model_path.relative_to(partial)),
        **contents.facts(model_path),
    }
    layout.commit(root, manifest)
    return manifest


def termination_summary(manifest: dict) -> str:
    """The line the Job leaves in its termination message, which the operator reads (< 4 KiB): a
    model's architecture (an EAGLE head's shape), or an adapter's rank, alpha, targets and base model."""
    keep = ("revision", "bytes", "modelPath", "architecture", "storedQuantization", "eagleHead", "adapter")
    return json.dumps({k: manifest[k] for k in keep if k in manifest}, separators=(",", ":"))
