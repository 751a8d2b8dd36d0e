"""Where a LoRA adapter's folder is: a local path as given, or an hf://org/name[@revision] or
s3://bucket/prefix source downloaded once into the adapter cache by the model cache's own fetch
(pinned, verified against the sizes and hashes the server announces, resumed after an interruption).

An hf:// source named by a branch or tag (main when none) is pinned to the commit it points at when
the adapter is loaded, so the cache is keyed by what was downloaded and a moved branch downloads
anew. Only a PEFT adapter's two files are fetched from a repository (hub repositories of adapters
often carry training checkpoints besides). Each source lands in
`<download dir>/lora/<cache key>/model`, laid out as contract/cache_layout.py says; two loads of
the same source at once share the download.

Every failure (an unknown repository or revision, an empty prefix, a source without
adapter_config.json, a refused download) is a LoraAdapterError of one sentence naming the adapter.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.sources import COMMIT_PATTERN, HubSource, RemoteSource, cache_key, parse_remote
from pagoda_runtime.engine.protocol import LoraAdapterError
from pagoda_runtime.loading.lora_adapter import CONFIG_FILE
from pagoda_runtime.loading.model_cache.adapter import ADAPTER, ADAPTER_FILES
from pagoda_runtime.loading.model_cache.fetch import fetch
from pagoda_runtime.loading.model_cache.hub import commit_of

log = logging.getLogger(__name__)

SCHEMES = ("hf://", "s3://")


def default_download_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pagoda"


def adapter_folder(name: str, path: str, download_dir: str | Path | None = None) -> str:
    """The local folder of the adapter `name` at `path`: `path` itself unless it is an hf:// or
    s3:// source, which is downloaded first unless the cache holds it."""
    if not path.startswith(SCHEMES):
        return path
    try:
        source = _source(path)
        key = cache_key(source.uri, source.revision if isinstance(source, HubSource) else None)
        root = Path(download_dir or default_download_dir()) / "lora" / key
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root):
            manifest = fetch(source, root, emit=log.debug, contents=ADAPTER)
    except Exception as exc:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {_why(path, exc)}") from exc
    return str(layout.model_dir(root) / manifest["modelPath"])


def adapter_source(uri: str, revision: str | None = None) -> RemoteSource:
    """An adapter's source as the cache fetches it (`pagoda-runtime fetch --adapter` too): of a hub
    repository, at a pinned commit, the adapter's two files only; ValueError says what is wrong."""
    if not uri.startswith("hf://"):
        return parse_remote(uri, revision)
    if uri.endswith(".gguf"):
        raise ValueError(f"{uri} names a GGUF file; give the repository of a PEFT adapter, hf://org/name")
    return parse_remote(uri, revision, allow_patterns=ADAPTER_FILES)


def _source(path: str) -> RemoteSource:
    if not path.startswith("hf://"):
        return adapter_source(path)
    uri, _, revision = path.partition("@")
    if not re.fullmatch(r"hf://[^/\s]+/[^/\s]+", uri):
        raise ValueError(f"{uri} is not a hub repository; give hf://org/name[@revision]")
    if not re.match(COMMIT_PATTERN, revision):
        revision = commit_of(uri.removeprefix("hf://"), revision or "main")
    return adapter_source(uri, revision)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Held while a source is fetched into `root`: a second load of it waits, then finds it cached."""
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _why(path: str, exc: Exception) -> str:
    if isinstance(exc, RevisionNotFoundError):
        return f"{path} names a revision its repository does not have; give a branch, tag or commit of it"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"the hub has no repository {path.removeprefix('hf://').partition('@')[0]} that this server "
            "may read; check the name, and HF_TOKEN for a private or gated one"
        )
    if isinstance(exc, FileNotFoundError) and path.startswith("hf://"):
        return f"{path} holds no {CONFIG_FILE}; give the repository of a PEFT adapter"
    reason = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ValueError | FileNotFoundError):
        return reason
    return f"downloading {path} failed: {type(exc).__name__}: {reason}"
