"""hf:// models through huggingface_hub: a pinned commit, a token, and HF_ENDPOINT for a mirror.

`snapshot_download` into a local folder resumes the files a previous attempt left half-written
(their `.incomplete` parts under `.cache/huggingface`) and skips the ones already complete.
`serve --model org/name[@revision]` goes through `hub_model`, into the Hugging Face cache as vLLM does.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import filter_repo_objects

from pagoda_runtime.contract.sources import HubSource
from pagoda_runtime.loading.model_cache.verify import Expected


def _endpoint() -> str | None:
    # Read per call rather than at import (as huggingface_hub's constants are), so HF_ENDPOINT set by
    # the Job or a test always wins.
    return os.environ.get("HF_ENDPOINT") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def list_files(source: HubSource) -> list[Expected]:
    """Every file of the commit that the source's patterns keep, with its size and the hash the hub
    announces for it."""
    api = HfApi(endpoint=_endpoint(), token=_token())
    entries = [
        e
        for e in api.list_repo_tree(source.repo, revision=source.revision, recursive=True)
        if isinstance(e, RepoFile)
    ]
    kept = list(
        filter_repo_objects(
            entries,
            allow_patterns=list(source.allowed) if source.allowed else None,
            ignore_patterns=list(source.ignore_patterns) or None,
            key=lambda e: e.path,
        )
    )
    if not kept:
        raise FileNotFoundError(
            f"no file of {source.uri} at {source.revision} matches "
            f"allowPatterns {list(source.allowed or ())} / ignorePatterns {list(source.ignore_patterns)}; "
            f"the repository holds {', '.join(sorted(e.path for e in entries)[:20])}"
        )
    files = []
    for entry in kept:
        if entry.lfs is not None:
            files.append(Expected(entry.path, entry.lfs.size, "sha256", entry.lfs.sha256))
        else:
            files.append(Expected(entry.path, entry.size, "git-sha1", entry.blob_id))
    return files


def commit_of(repo: str, revision: str) -> str:
    """The commit a branch or tag of `repo` points at now (what pins a source named by a branch)."""
    return HfApi(endpoint=_endpoint(), token=_token()).model_info(repo, revision=revision).sha


def download(source: HubSource, folder: Path) -> None:
    snapshot_download(
        source.repo,
        revision=source.revision,
        local_dir=folder,
        endpoint=_endpoint(),
        token=_token(),
        allow_patterns=list(source.allowed) if source.allowed else None,
        ignore_patterns=list(source.ignore_patterns) or None,
        max_workers=4,
    )
    # huggingface_hub's bookkeeping for resuming; the finished model does not need it.
    shutil.rmtree(folder / ".cache", ignore_errors=True)


# A hub id as `vllm serve` takes it, with an optional @revision (a commit, branch or tag).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(@(?P<revision>[\w./-]+))?$")


def is_hub_id(model: str) -> bool:
    """`org/name[@revision]` naming no local file or folder."""
    return _HUB_ID.match(model) is not None and not Path(model).expanduser().exists()


def hub_model(model: str, revision: str | None = None) -> Path:
    """The snapshot of a hub id in the Hugging Face cache (HF_HOME, HF_HUB_CACHE), downloaded first
    unless it is there (with HF_HUB_OFFLINE=1 only what is there): the folder, or its one GGUF file."""
    match = _HUB_ID.match(model)
    if match is None:
        raise ValueError(f"{model!r} is not a hub id such as org/name or org/name@revision")
    if match["revision"] and revision and match["revision"] != revision:
        raise ValueError(f"{model} names revision {match['revision']} but --revision says {revision}")
    folder = Path(
        snapshot_download(
            match["repo"], revision=match["revision"] or revision, endpoint=_endpoint(), token=_token()
        )
    )
    ggufs = sorted(folder.rglob("*.gguf"))
    if not (folder / "config.json").is_file() and len(ggufs) == 1:
        return ggufs[0]
    return folder
