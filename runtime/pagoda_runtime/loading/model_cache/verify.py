"""Checks that a fetched file is the one the server described: its size, and a hash where one is known."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 8 * 2**20


class VerificationError(ValueError):
    pass


@dataclass(frozen=True)
class Expected:
    """What a file must be. `digest` is checked by `algorithm`: sha256 (LFS files), git-sha1 (a git
    blob id, the hub's id of small files) or md5 (an S3 ETag of a single-part upload)."""

    path: str
    size: int
    algorithm: str | None = None
    digest: str | None = None


def _hasher(algorithm: str, size: int):
    if algorithm == "git-sha1":
        h = hashlib.sha1()
        h.update(f"blob {size}\0".encode())
        return h
    return hashlib.new(algorithm)


def verify_file(folder: Path, expected: Expected) -> None:
    path = folder / expected.path
    if not path.is_file():
        raise VerificationError(f"{expected.path} is missing after the download")
    size = path.stat().st_size
    if size != expected.size:
        raise VerificationError(f"{expected.path} has {size} bytes but the server announced {expected.size}")
    if expected.algorithm is None:
        return
    h = _hasher(expected.algorithm, size)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    if h.hexdigest() != expected.digest:
        raise VerificationError(
            f"{expected.path} has {expected.algorithm} {h.hexdigest()} but the server announced "
            f"{expected.digest}: the download is corrupt"
        )
