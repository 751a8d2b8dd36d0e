"""Model source URIs, parsed once: hf://org/name (or hf://org/name/file.gguf), s3://bucket/prefix,
pvc://claim/path, bundled://name."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# A commit id pins an hf:// model: a branch or tag may move, and a cache keyed by it would go stale.
COMMIT_PATTERN = r"^[0-9a-f]{40}$"
# One GGUF file of a repository that holds several (one per quantization) names that file alone.
_HF = re.compile(r"^hf://(?P<repo>[^/\s]+/[^/\s]+)(/(?P<file>\S+\.gguf))?$")
_S3 = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(?P<prefix>.*))?$")


@dataclass(frozen=True)
class HubSource:
    repo: str
    revision: str
    file: str | None = None  # hf://org/name/file.gguf: that file only
    # huggingface_hub's filters (fnmatch patterns on the repository's paths); none: every file.
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()

    @property
    def uri(self) -> str:
        return f"hf://{self.repo}" + (f"/{self.file}" if self.file else "")

    @property
    def allowed(self) -> tuple[str, ...] | None:
        """What huggingface_hub's allow_patterns gets: the one file, the patterns, or None (all)."""
        if self.file:
            return (self.file,)
        return self.allow_patterns or None


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str  # an object key (a .gguf file) or a folder of objects; "" for the whole bucket

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def is_file(self) -> bool:
        return self.prefix.endswith(".gguf")


RemoteSource = HubSource | S3Source


@dataclass(frozen=True)
class PvcSource:
    """A user's own claim holding a checkpoint: mounted read-only, never downloaded."""

    claim: str
    path: str  # inside the claim: a model folder or a .gguf file; "" for the claim's root

    def under(self, mount: str) -> str:
        """The checkpoint's path where the claim is mounted at `mount`."""
        return f"{mount}/{self.path}".rstrip("/")


def parse_pvc(uri: str) -> PvcSource:
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return PvcSource(claim, path.strip("/"))


def parse_remote(
    uri: str,
    revision: str | None = None,
    allow_patterns: tuple[str, ...] = (),
    ignore_patterns: tuple[str, ...] = (),
) -> RemoteSource:
    """The source a download Job fetches; ValueError says what is wrong with the URI."""
    if match := _HF.match(uri):
        if revision is None or not re.match(COMMIT_PATTERN, revision):
            raise ValueError(
                f"{uri} needs a revision pinned to a 40-character commit id, got {revision!r}; "
                "copy it from the model's commit history"
            )
        if match["file"] and allow_patterns:
            raise ValueError(
                f"{uri} names one file already: drop the allow patterns, or the file from the URI"
            )
        return HubSource(
            match["repo"], revision, match["file"], tuple(allow_patterns), tuple(ignore_patterns)
        )
    if allow_patterns or ignore_patterns:
        raise ValueError(f"allow and ignore patterns apply to hf:// sources only, not {uri}")
    if match := _S3.match(uri):
        return S3Source(match["bucket"], (match["prefix"] or "").strip("/"))
    raise ValueError(f"cannot download {uri!r}: use hf://org/name or s3://bucket/prefix")


def cache_key(
    uri: str,
    revision: str | None,
    allow_patterns: tuple[str, ...] = (),
    ignore_patterns: tuple[str, ...] = (),
) -> str:
    """Names one cached model revision: the same source at the same revision, filtered by the same
    patterns, shares one cache (a source without patterns keeps the key it always had)."""
    text = f"{uri}@{revision or ''}"
    if allow_patterns or ignore_patterns:
        text += f"|allow={','.join(allow_patterns)}|ignore={','.join(ignore_patterns)}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]
