"""The cache folder's layout, the contract between the download Job (writer) and replicas (readers).

    <root>/model/                 the model, present only once complete (renamed into place)
    <root>/model/.pagoda-model.json   what was fetched: source, revision, files, sizes, architecture
    <root>/.partial/              the download in progress; survives a restart so it resumes

The final folder appears by one rename, so a reader sees either no model or a complete one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODEL_DIR = "model"
PARTIAL_DIR = ".partial"
MANIFEST = ".pagoda-model.json"


def model_dir(root: Path) -> Path:
    return root / MODEL_DIR


def partial_dir(root: Path) -> Path:
    return root / PARTIAL_DIR


def read_manifest(root: Path) -> dict | None:
    """The manifest of a complete cache, or None while the model is absent."""
    path = model_dir(root) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def commit(root: Path, manifest: dict) -> Path:
    """Writes the manifest into the partial folder and renames it into place, atomically."""
    partial = partial_dir(root)
    tmp = partial / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, partial / MANIFEST)
    final = model_dir(root)
    os.rename(partial, final)
    return final
