"""Forward TCP connections from LISTEN (host:port) to TARGET (host:port): ``tcp_forward.py L T``.

The loopback apiserver seen from the node's network namespace. Stdlib only.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _main(listen: str, target: str) -> None:
    target_host, target_port = target.rsplit(":", 1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, int(target_port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
