"""A LoRA adapter in the model cache: the same folder layout, Job and checks as a model's (ADAPTER:
a listing without the adapter's two files is refused before any byte is downloaded), with the
adapter's rank (from adapter_config.json) as the facts the operator reads back, and a copy from a
mounted folder for an adapter on the user's own claim (pvc://), which the replicas never mount.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.sources import HubSource, RemoteSource
from pagoda_runtime.loading.lora_adapter import CONFIG_FILE, WEIGHTS_FILE, adapter_rank
from pagoda_runtime.loading.model_cache.fetch import Contents
from pagoda_runtime.loading.model_cache.verify import Expected, verify_file

ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)


def adapter_facts(folder: Path, source: str | None = None) -> dict:
    """{"adapter": {"rank": r}}, once the folder is a PEFT LoRA adapter Pagoda applies; `source`
    names it in an error (the folder when not given)."""
    return {"adapter": {"rank": adapter_rank(source or str(folder), folder)}}


def _check_listing(source: RemoteSource, files: list[Expected]) -> None:
    held = {f.path for f in files}
    where = source.uri + (f" at {source.revision}" if isinstance(source, HubSource) else "")
    for file in ADAPTER_FILES:
        if file not in held:
            raise ValueError(f"{where} holds no {file}; give the repository or prefix of a PEFT adapter")


ADAPTER = Contents(_check_listing, adapter_facts)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()


def copy_adapter(source: Path, root: Path) -> dict:
    """Copies the adapter folder `source` into `root` unless it is there (its two files, checked by
    size and sha256 against the originals); returns the manifest."""
    done = layout.read_manifest(root)
    if done is not None:
        return done
    partial = layout.partial_dir(root)
    partial.mkdir(parents=True, exist_ok=True)
    expected = []
    for name in ADAPTER_FILES:
        original = source / name
        if not original.is_file():
            raise FileNotFoundError(f"{source} holds no {name}; give a PEFT LoRA adapter folder")
        expected.append(Expected(name, original.stat().st_size, "sha256", _sha256(original)))
        shutil.copyfile(original, partial / name)
    for file in expected:
        verify_file(partial, file)
    manifest = {
        "source": str(source),
        "revision": None,
        "bytes": sum(f.size for f in expected),
        "files": {f.path: f.size for f in expected},
        "modelPath": ".",
        **adapter_facts(partial, str(source)),
    }
    layout.commit(root, manifest)
    return manifest
