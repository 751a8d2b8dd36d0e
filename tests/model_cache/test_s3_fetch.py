"""s3:// downloads through the MinIO client against a real MinIO server on loopback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.bundled import resolve_model
from pagoda_runtime.contract.sources import parse_remote
from pagoda_runtime.loading.model_cache import s3
from pagoda_runtime.loading.model_cache.fetch import fetch
from pagoda_runtime.loading.model_cache.verify import VerificationError
from pagoda_runtime.loading.model_source import load_model_source

from tests.model_cache.minio_server import ACCESS_KEY, SECRET_KEY, MinioServer
from tests.model_cache.oidc_issuer import OidcIssuer
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


class _Counting:
    """Wraps the client's get_object: how many GETs, how many at once at most, which ranges."""

    def __init__(self, client, monkeypatch):
        self.calls, self.active, self.most = [], 0, 0
        self.lock = threading.Lock()
        original = client.get_object

        def get_object(bucket, key, offset=0, length=0, **kwargs):
            with self.lock:
                self.active += 1
                self.most = max(self.most, self.active)
                self.calls.append((key, offset, length))
            try:
                time.sleep(0.05)  # long enough for the others to start beside it
                return original(bucket, key, offset=offset, length=length, **kwargs)
            finally:
                with self.lock:
                    self.active -= 1

        monkeypatch.setattr(client, "get_object", get_object)


def test_objects_and_parts_download_in_parallel(s3_env, tmp_path, monkeypatch):
    monkeypatch.setattr(s3, "PART_SIZE", 16 * 1024)
    client = s3.client()
    counting = _Counting(client, monkeypatch)
    monkeypatch.setattr(s3, "client", lambda: client)
    manifest = fetch(parse_remote("s3://models/llama"), tmp_path, emit=lambda _: None)
    model = layout.model_dir(tmp_path)
    for path in s3_env.tiny.iterdir():
        assert (model / path.name).read_bytes() == path.read_bytes(), path.name
    largest = max(s3_env.tiny.iterdir(), key=lambda p: p.stat().st_size)
    parts = [c for c in counting.calls if c[0].endswith(largest.name)]
    assert len(parts) == -(-largest.stat().st_size // s3.PART_SIZE)
    assert counting.most > 1, "the GETs ran one at a time"
    assert not any(p.name.endswith(".part") or ".part." in p.name for p in model.iterdir())
    assert manifest["bytes"] == sum(p.stat().st_size for p in s3_env.tiny.iterdir())


def test_an_interrupted_part_of_a_large_object_resumes_alone(s3_env, tmp_path, monkeypatch):
    monkeypatch.setattr(s3, "PART_SIZE", 16 * 1024)
    largest = max(s3_env.tiny.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    stat = s3_env.client().stat_object(BUCKET, f"llama/{largest.name}")
    part = layout.partial_dir(tmp_path) / f"{largest.name}.{stat.etag.strip(chr(34))}.part.1"
    part.parent.mkdir(parents=True)
    part.write_bytes(largest.read_bytes()[s3.PART_SIZE : s3.PART_SIZE + 5000])
    client = s3.client()
    counting = _Counting(client, monkeypatch)
    monkeypatch.setattr(s3, "client", lambda: client)
    fetch(parse_remote("s3://models/llama"), tmp_path, emit=lambda _: None)
    assert (layout.model_dir(tmp_path) / largest.name).read_bytes() == largest.read_bytes()
    resumed = [c for c in counting.calls if c[0].endswith(largest.name) and c[1] == s3.PART_SIZE + 5000]
    assert resumed == [(f"llama/{largest.name}", s3.PART_SIZE + 5000, s3.PART_SIZE - 5000)]


def test_credentials_from_a_web_identity_token_when_no_keys_are_given(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("a.jwt.token")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/models")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:1")
    # It asks the STS endpoint given, with the token from the file (nothing listens there).
    with pytest.raises(PermissionError, match=r"STS \(http://127.0.0.1:1\) refused"):
        s3.client()


@pytest.fixture(scope="module")
def sts_minio(minio, tmp_path_factory):
    """A MinIO whose STS trusts the issuer's tokens (their `policy` claim names the MinIO policy the
    exchanged credentials get), holding the same model."""
    with OidcIssuer(tmp_path_factory.mktemp("issuer")) as issuer:
        env = {
            "MINIO_IDENTITY_OPENID_CONFIG_URL": issuer.config_url,
            "MINIO_IDENTITY_OPENID_CLIENT_ID": "sts.amazonaws.com",
            "MINIO_IDENTITY_OPENID_CLAIM_NAME": "policy",
        }
        with MinioServer(tmp_path_factory.mktemp("sts-minio-data"), env=env) as server:
            client = server.client()
            client.make_bucket(BUCKET)
            for path in sorted(minio.tiny.iterdir()):
                client.fput_object(BUCKET, f"llama/{path.name}", str(path))
            server.issuer = issuer
            server.tiny = minio.tiny
            yield server


def test_a_service_account_token_is_exchanged_for_credentials(sts_minio, tmp_path, monkeypatch):
    """What the download Job of s3.serviceAccountName does with its projected token."""
    token = tmp_path / "token"
    token.write_text(sts_minio.issuer.token("sts.amazonaws.com", policy="readwrite"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", sts_minio.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts_minio.endpoint)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    manifest = fetch(parse_remote("s3://models/llama"), tmp_path / "cache", emit=lambda _: None)
    assert sorted(manifest["files"]) == sorted(p.name for p in sts_minio.tiny.iterdir())

    # A token for another audience is refused by the STS, nothing is downloaded, and the reason
    # (which reaches the status) does not carry the token.
    wrong = sts_minio.issuer.token("another-audience", policy="readwrite")
    token.write_text(wrong)
    with pytest.raises(PermissionError, match="refused the ServiceAccount token") as refused:
        fetch(parse_remote("s3://models/llama"), tmp_path / "other", emit=lambda _: None)
    assert wrong.split(".")[2] not in str(refused.value)
    assert not layout.model_dir(tmp_path / "other").exists()
