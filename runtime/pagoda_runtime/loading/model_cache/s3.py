"""s3:// models from any S3-compatible endpoint through the MinIO client.

Endpoint and credentials come from the environment as for the AWS tools (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION). Each object downloads into
`<file>.<etag>.part` and resumes from its length with a ranged GET conditioned on the same ETag,
so an interrupted Job continues where it stopped and never mixes two versions of an object.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from minio import Minio

from pagoda_runtime.contract.sources import S3Source
from pagoda_runtime.loading.model_cache.verify import Expected

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_CHUNK = 4 * 2**20


def client() -> Minio:
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "https://s3.amazonaws.com")
    url = urlparse(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"AWS_ENDPOINT_URL {endpoint!r} is not an http(s) URL such as http://minio:9000")
    return Minio(
        url.netloc,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
        region=os.environ.get("AWS_REGION") or None,
        secure=url.scheme == "https",
    )


def _relative(source: S3Source, key: str) -> str:
    if source.is_file:
        return PurePosixPath(key).name
    return key[len(source.prefix) :].lstrip("/") if source.prefix else key


def list_files(source: S3Source, s3: Minio) -> list[tuple[str, Expected, str]]:
    """(object key, what the local file must be, ETag) for each object under the source."""
    if source.is_file:
        stats = [s3.stat_object(source.bucket, source.prefix)]
        keys = [source.prefix]
    else:
        prefix = f"{source.prefix}/" if source.prefix else ""
        stats = [o for o in s3.list_objects(source.bucket, prefix=prefix, recursive=True) if not o.is_dir]
        keys = [o.object_name for o in stats]
    files = []
    for key, stat in zip(keys, stats, strict=True):
        etag = (stat.etag or "").strip('"')
        # A multipart upload's ETag is not the MD5 of the object; then the size is what is checked.
        algorithm, digest = ("md5", etag) if _MD5.match(etag) else (None, None)
        files.append((key, Expected(_relative(source, key), stat.size, algorithm, digest), etag))
    if not files:
        raise FileNotFoundError(f"{source.uri} holds no objects; check the bucket and prefix")
    return files


def download(source: S3Source, folder: Path, s3: Minio) -> None:
    for key, expected, etag in list_files(source, s3):
        target = folder / expected.path
        if target.is_file() and target.stat().st_size == expected.size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f"{target.name}.{etag or 'noetag'}.part")
        have = part.stat().st_size if part.is_file() else 0
        if have < expected.size:
            response = s3.get_object(
                source.bucket, key, offset=have, request_headers={"If-Match": etag} if etag else None
            )
            try:
                with open(part, "ab") as out:
                    for chunk in response.stream(_CHUNK):
                        out.write(chunk)
            finally:
                response.close()
                response.release_conn()
        os.replace(part, target)
