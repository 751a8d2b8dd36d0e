"""s3:// downloads through the MinIO client against a real MinIO server on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.bundled import resolve_model
from pagoda_runtime.contract.sources import parse_remote
from pagoda_runtime.loading.model_cache.fetch import fetch
from pagoda_runtime.loading.model_cache.verify import VerificationError
from pagoda_runtime.loading.model_source import load_model_source

from tests.model_cache.minio_server import ACCESS_KEY, SECRET_KEY, MinioServer
from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model

BUCKET = "models"


@pytest.fixture(scope="module")
def minio(tmp_path_factory):
    tiny = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama3", sharded=True)
    gguf = build_tiny_gguf(tiny, tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf", "Q8_0")
    with MinioServer(tmp_path_factory.mktemp("minio-data")) as server:
        client = server.client()
        client.make_bucket(BUCKET)
        for path in sorted(tiny.iterdir()):
            client.fput_object(BUCKET, f"llama/{path.name}", str(path))
        client.fput_object(BUCKET, "gguf/tiny.Q8_0.gguf", str(gguf))
        server.tiny = tiny
        yield server


@pytest.fixture
def s3_env(minio, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", minio.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    return minio


def test_folder_is_fetched_verified_and_sized(s3_env, tmp_path):
    manifest = fetch(parse_remote("s3://models/llama"), tmp_path, emit=lambda _: None)
    model = layout.model_dir(tmp_path)
    assert sorted(manifest["files"]) == sorted(p.name for p in s3_env.tiny.iterdir())
    assert manifest["architecture"] == vars(load_model_source(s3_env.tiny).config.architecture)
    assert resolve_model(str(model)) == model


def test_a_single_gguf_object_is_what_the_runtime_opens(s3_env, tmp_path):
    manifest = fetch(parse_remote("s3://models/gguf/tiny.Q8_0.gguf"), tmp_path, emit=lambda _: None)
    assert manifest["storedQuantization"] == "gguf"
    assert resolve_model(str(layout.model_dir(tmp_path))) == layout.model_dir(tmp_path) / "tiny.Q8_0.gguf"


def _interrupted(root: Path, s3_env, prefix: bytes) -> None:
    """What a Job killed mid-download leaves: the first bytes of the largest object in its part file."""
    client = s3_env.client()
    stat = max(client.list_objects(BUCKET, "llama/"), key=lambda o: o.size)
    part = layout.partial_dir(root) / f"{Path(stat.object_name).name}.{stat.etag.strip(chr(34))}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(prefix)


def test_an_interrupted_download_resumes_from_its_part_file(s3_env, tmp_path):
    largest = max(s3_env.tiny.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    _interrupted(tmp_path, s3_env, largest.read_bytes()[:40_000])
    fetch(parse_remote("s3://models/llama"), tmp_path, emit=lambda _: None)
    assert (layout.model_dir(tmp_path) / largest.name).read_bytes() == largest.read_bytes()


def test_bytes_that_do_not_match_the_etag_are_never_served(s3_env, tmp_path):
    # Resuming trusts the part file's prefix; the MD5 check catches a prefix that was wrong.
    _interrupted(tmp_path, s3_env, b"\0" * 40_000)
    with pytest.raises(VerificationError, match="corrupt"):
        fetch(parse_remote("s3://models/llama"), tmp_path, emit=lambda _: None)
    assert not layout.model_dir(tmp_path).exists()


def test_wrong_credentials_fail_with_the_servers_reason(s3_env, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(Exception, match="SignatureDoesNotMatch|AccessDenied|InvalidAccessKeyId"):
        fetch(parse_remote("s3://models/llama"), tmp_path, emit=lambda _: None)
    assert not layout.model_dir(tmp_path).exists()
