"""Server-Sent Events framing as OpenAI streams it: one `data:` line per JSON chunk, then [DONE]."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
# Proxies (nginx) buffer responses unless told not to, which would hold tokens back.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: BaseModel | dict, exclude: set[str] | None = None) -> bytes:
    data = payload.model_dump(exclude=exclude) if isinstance(payload, BaseModel) else payload
    return b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A streaming response that always runs its cleanup, even when the client is gone.

    Starlette cancels the sending task on disconnect, possibly before the chunk generator has
    even started, and leaves the generator to the garbage collector; on_close runs here instead,
    at once (it aborts the engine request and ends the request's in-flight count).
    """

    def __init__(self, chunks: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(chunks, media_type=MEDIA_TYPE, headers=HEADERS)
        self._chunks = chunks
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._chunks.aclose()
            await self._on_close()
