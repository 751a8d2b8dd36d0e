"""Several engine requests answering one HTTP request (a completions request with a list of
prompts, as vLLM and OpenAI's legacy API take it): their outputs as they come, or all their final
outputs at once.

Nothing comes out before every request has its first output, so that one the engine refuses (a
prompt past the context, say) fails the whole response before its first chunk, as a lone request
does. Closing the merge early (the client went away, or one request failed) closes every request,
which aborts those unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pagoda_runtime.engine.outputs import RequestOutput


async def merged(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Each request's outputs tagged with its index in `streams`, in the order they come."""
    if len(streams) == 1:  # the common case needs no task per output
        async with contextlib.aclosing(streams[0]) as only:
            async for out in only:
                yield 0, out
        return
    pending: dict[asyncio.Future, int] = {}
    held: list[tuple[int, RequestOutput]] | None = []  # None once every request has begun
    begun: set[int] = set()
    try:
        pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    out = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(streams[i]))] = i
                if held is None:
                    yield i, out
                    continue
                held.append((i, out))
                begun.add(i)
                if len(begun) == len(streams):
                    ready, held = held, None
                    for item in ready:
                        yield item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


async def finals(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[list[RequestOutput]]:
    """Once: every request's final output, in the order of `streams`."""
    last: list[RequestOutput | None] = [None] * len(streams)
    async with contextlib.aclosing(merged(streams)) as outputs:
        async for i, out in outputs:
            last[i] = out
    yield last
