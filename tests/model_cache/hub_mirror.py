"""A Hugging Face hub mirror on loopback: serves model folders at pinned commits with the hub's URL
paths and headers, so huggingface_hub downloads from it exactly as from the hub (HF_ENDPOINT).

    GET  /api/models/{org}/{name}/revision/{rev}      repo info (id, sha, siblings)
    GET  /api/models/{org}/{name}/tree/{rev}          the file list, LFS files with their sha256
    HEAD /{org}/{name}/resolve/{rev}/{path}           X-Repo-Commit, ETag, Content-Length
    GET  /{org}/{name}/resolve/{rev}/{path}           the bytes, honouring Range (resume)

`cut_after` makes the server close the connection after that many body bytes of one GET, once:
an interrupted download, for the resume tests.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_id(data_path: Path) -> str:
    h = hashlib.sha1()
    h.update(f"blob {data_path.stat().st_size}\0".encode())
    h.update(data_path.read_bytes())
    return h.hexdigest()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**22):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Repo:
    folder: Path
    commit: str
    entries: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            rel = path.relative_to(self.folder).as_posix()
            entry = {"type": "file", "path": rel, "size": path.stat().st_size, "oid": git_blob_id(path)}
            if rel.endswith(LFS_SUFFIXES):
                digest = sha256_of(path)
                entry["lfs"] = {"oid": digest, "size": entry["size"], "pointerSize": 134}
            self.entries[rel] = entry

    def etag(self, rel: str) -> str:
        entry = self.entries[rel]
        return entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]


class HubMirror:
    def __init__(self, token: str | None = None):
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.cut_after: int | None = None  # cuts the first GET of a file larger than this
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                mirror._handle(self, body=False)

            def do_GET(self):
                mirror._handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo_id: str, folder: Path, commit: str) -> Repo:
        self.repos[repo_id] = repo = Repo(folder, commit)
        return repo

    def __enter__(self) -> HubMirror:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _send_json(self, handler, status: int, payload, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _error(self, handler, status: int, code: str, message: str) -> None:
        self._send_json(
            handler, status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message}
        )

    def _handle(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append((handler.command, path, handler.headers.get("Range")))
        if self.token is not None and handler.headers.get("Authorization") != f"Bearer {self.token}":
            self._error(handler, 401, "GatedRepo", "Invalid credentials in Authorization header")
            return
        if match := re.match(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)$", path):
            repo_id, kind, rev = match.groups()
            repo = self._repo(handler, repo_id, rev)
            if repo is None:
                return
            if kind == "revision":
                siblings = [{"rfilename": p} for p in repo.entries]
                self._send_json(handler, 200, {"id": repo_id, "sha": repo.commit, "siblings": siblings})
            else:
                self._send_json(handler, 200, list(repo.entries.values()))
            return
        if match := re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path):
            repo_id, rev, rel = match.groups()
            repo = self._repo(handler, repo_id, rev)
            if repo is not None:
                self._serve_file(handler, repo, rel, body)
            return
        self._error(handler, 404, "EntryNotFound", f"no route for {path}")

    def _repo(self, handler, repo_id: str, rev: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(handler, 404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if rev not in (repo.commit, "main"):
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    def _serve_file(self, handler, repo: Repo, rel: str, body: bool) -> None:
        if rel not in repo.entries:
            self._error(handler, 404, "EntryNotFound", f"{rel} does not exist at {repo.commit}")
            return
        data_path = repo.folder / rel
        size = data_path.stat().st_size
        start = 0
        status = 200
        range_header = handler.headers.get("Range")
        if body and range_header and (m := re.match(r"bytes=(\d+)-", range_header)):
            start, status = int(m.group(1)), 206
        handler.send_response(status)
        handler.send_header("X-Repo-Commit", repo.commit)
        handler.send_header("ETag", f'"{repo.etag(rel)}"')
        handler.send_header("Content-Length", str(size - start))
        handler.send_header("Accept-Ranges", "bytes")
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        handler.end_headers()
        if not body:
            return
        limit = size - start
        with self._lock:
            if self.cut_after is not None and limit > self.cut_after:
                limit, self.cut_after = self.cut_after, None
        with open(data_path, "rb") as f:
            f.seek(start)
            remaining = limit
            while remaining > 0 and (chunk := f.read(min(remaining, 2**20))):
                handler.wfile.write(chunk)
                remaining -= len(chunk)
        if limit < size - start:
            handler.close_connection = True
            handler.wfile.flush()
            handler.connection.shutdown(2)
