"""The HTTP edge every request crosses first: request id, API key, body size and nesting limits,
access log.

Written as plain ASGI rather than Starlette's BaseHTTPMiddleware because the latter buffers
streaming responses in ways that delay SSE chunks and hide client disconnects.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import uuid

from pagoda_runtime.logs import request_id_var
from pagoda_runtime.server.errors import error_body
from pagoda_runtime.server.json_depth import MAX_JSON_DEPTH, too_deep

log = logging.getLogger("pagoda.access")

_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_error(
    send, status: int, message: str, code: str | None = None, extra_headers=(), param: str | None = None
) -> None:
    body = json.dumps(error_body(status, message, param=param, code=code)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class EdgeMiddleware:
    def __init__(self, app, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        request_id = given if given and _VALID_REQUEST_ID.match(given) else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 0

        async def send_with_id(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())],
                }
            await send(message)

        started = time.monotonic()
        try:
            await self._guarded(scope, receive, send_with_id)
        finally:
            log.info(
                "%s %s %d %.3fs",
                scope["method"],
                scope["path"],
                status,
                time.monotonic() - started,
                extra={"method": scope["method"], "path": scope["path"], "status": status},
            )
            request_id_var.reset(token)

    async def _guarded(self, scope, receive, send) -> None:
        if self.api_key and scope["path"].startswith("/v1/") and not self._authorized(scope):
            await _send_error(
                send,
                401,
                "Missing or incorrect API key; send it as 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
                extra_headers=[(b"www-authenticate", b"Bearer")],
            )
            return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive)
        if body is None:
            await _send_error(
                send,
                413,
                f"The request body is larger than the limit of {self.max_body_bytes} bytes; send less.",
            )
            return
        deep, field = too_deep(body)
        if deep:
            where = f"'{field}'" if field is not None else "The request body"
            await _send_error(
                send,
                400,
                f"{where} nests JSON arrays and objects deeper than {MAX_JSON_DEPTH} levels; flatten it.",
                param=field,
            )
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            # After the body, the app only waits for the client to go away.
            return await receive()

        await self.app(scope, replay, send)

    def _authorized(self, scope: dict) -> bool:
        given = _header(scope, b"authorization") or ""
        scheme, _, key = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key.encode())

    async def _read_body(self, scope: dict, receive) -> bytes | None:
        """The whole body, or None when it exceeds the limit (checked before reading when declared)."""
        declared = _header(scope, b"content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)
