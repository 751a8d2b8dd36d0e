"""s3:// models from any S3-compatible endpoint through the MinIO client.

Endpoint and credentials come from the environment as for the AWS tools (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), or from a service account's token
(AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, as IRSA sets them; AWS_ENDPOINT_URL_STS for an STS
other than AWS's, such as MinIO's own). Objects and the parts of large objects download in parallel
(ranged GETs). Each part downloads into `<file>.<etag>.part` (`.part.<n>` for the n-th part of a large
object) and resumes from its length with a ranged GET conditioned on the same ETag, so an
interrupted Job continues where it stopped and never mixes two versions of an object.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import urllib3
from minio import Minio
from minio.credentials.providers import IamAwsProvider

from pagoda_runtime.contract.sources import S3Source
from pagoda_runtime.loading.model_cache.verify import Expected

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_CHUNK = 4 * 2**20
# Objects above this size download as several ranged GETs at once (the throughput of one S3
# connection is far below a node's network); parts are what a resumed attempt re-fetches at most.
PART_SIZE = 64 * 2**20
CONCURRENCY = 8


def client() -> Minio:
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "https://s3.amazonaws.com")
    url = urlparse(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"AWS_ENDPOINT_URL {endpoint!r} is not an http(s) URL such as http://minio:9000")
    # Every parallel GET needs a connection of its own.
    http = urllib3.PoolManager(maxsize=CONCURRENCY, retries=urllib3.Retry(total=5, backoff_factor=0.2))
    credentials = {}
    if not os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        credentials["credentials"] = _web_identity()
    return Minio(
        url.netloc,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
        region=os.environ.get("AWS_REGION") or None,
        secure=url.scheme == "https",
        http_client=http,
        **credentials,
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


def _web_identity() -> IamAwsProvider:
    """Credentials for a ServiceAccount token, exchanged once now so that a refusal is reported here:
    without the token, which the STS client puts in the URL it reports (the message reaches the
    InferenceService's status)."""
    # The token file, role and region are read from the environment by the provider.
    sts = os.environ.get("AWS_ENDPOINT_URL_STS")
    provider = IamAwsProvider(custom_endpoint=sts)
    try:
        provider.retrieve()
    except Exception as exc:  # the client's own error types vary: HTTP status, parse, connection
        reason = re.sub(r"WebIdentityToken=[^&\s]+", "WebIdentityToken=<redacted>", str(exc))
        raise PermissionError(
            f"the STS ({sts or 'AWS'}) refused the ServiceAccount token "
            f"({os.environ['AWS_WEB_IDENTITY_TOKEN_FILE']}): {reason}; check s3.roleArn, the token "
            "audience (s3.tokenAudience) and the role's trust of the cluster's issuer"
        ) from None
    return provider


@dataclass(frozen=True)
class _Part:
    key: str
    etag: str
    file: Path  # where this part's bytes go
    offset: int
    length: int


def _parts(key: str, expected: Expected, etag: str, target: Path) -> list[_Part]:
    stem = target.with_name(f"{target.name}.{etag or 'noetag'}.part")
    if expected.size <= PART_SIZE:
        return [_Part(key, etag, stem, 0, expected.size)]
    return [
        _Part(key, etag, stem.with_name(f"{stem.name}.{n}"), offset, min(PART_SIZE, expected.size - offset))
        for n, offset in enumerate(range(0, expected.size, PART_SIZE))
    ]


def _fetch_part(bucket: str, part: _Part, s3: Minio) -> None:
    have = part.file.stat().st_size if part.file.is_file() else 0
    if have >= part.length:
        return
    response = s3.get_object(
        bucket,
        part.key,
        offset=part.offset + have,
        length=part.length - have,
        request_headers={"If-Match": part.etag} if part.etag else None,
    )
    try:
        with open(part.file, "ab") as out:
            for chunk in response.stream(_CHUNK):
                out.write(chunk)
    finally:
        response.close()
        response.release_conn()


def _assemble(parts: list[_Part], target: Path) -> None:
    """The parts, in order, into the target: appended to the first one, each removed once appended,
    so that the bytes on disk (which the progress counts) never double."""
    first = parts[0].file
    with open(first, "ab") as out:
        for part in parts[1:]:
            with open(part.file, "rb") as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
            part.file.unlink()
    os.replace(first, target)


def download(
    source: S3Source, folder: Path, s3: Minio, listed: list[tuple[str, Expected, str]] | None = None
) -> None:
    """Every object under the source into `folder`: objects and parts CONCURRENCY at a time."""
    objects = []
    for key, expected, etag in listed if listed is not None else list_files(source, s3):
        target = folder / expected.path
        if target.is_file() and target.stat().st_size == expected.size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        objects.append((target, _parts(key, expected, etag, target)))
    with ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="s3-get") as pool:
        # list() re-raises the first failure once the others are done.
        list(
            pool.map(lambda part: _fetch_part(source.bucket, part, s3), [p for _, ps in objects for p in ps])
        )
    for target, parts in objects:
        _assemble(parts, target)
