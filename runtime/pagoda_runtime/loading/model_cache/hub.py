"""hf:// models through huggingface_hub: a pinned commit, a token, and HF_ENDPOINT for a mirror.

`snapshot_download` into a local folder resumes the files a previous attempt left half-written
(their `.incomplete` parts under `.cache/huggingface`) and skips the ones already complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.hf_api import RepoFile

from pagoda_runtime.contract.sources import HubSource
from pagoda_runtime.loading.model_cache.verify import Expected


def _endpoint() -> str | None:
    # Read per call rather than at import (as huggingface_hub's constants are), so HF_ENDPOINT set by
    # the Job or a test always wins.
    return os.environ.get("HF_ENDPOINT") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def list_files(source: HubSource) -> list[Expected]:
    """Every file of the commit with its size and the hash the hub announces for it."""
    api = HfApi(endpoint=_endpoint(), token=_token())
    files = []
    for entry in api.list_repo_tree(source.repo, revision=source.revision, recursive=True):
        if not isinstance(entry, RepoFile):
            continue
        if entry.lfs is not None:
            files.append(Expected(entry.path, entry.lfs.size, "sha256", entry.lfs.sha256))
        else:
            files.append(Expected(entry.path, entry.size, "git-sha1", entry.blob_id))
    return files


def download(source: HubSource, folder: Path) -> None:
    snapshot_download(
        source.repo,
        revision=source.revision,
        local_dir=folder,
        endpoint=_endpoint(),
        token=_token(),
        max_workers=4,
    )
    # huggingface_hub's bookkeeping for resuming; the finished model does not need it.
    shutil.rmtree(folder / ".cache", ignore_errors=True)
