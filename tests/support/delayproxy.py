"""A TCP proxy that delays every byte by a fixed time in each direction: network latency without ``netem``.

This kernel has no ``netem`` qdisc (tc can cap a link's rate with ``tbf``, not delay it), so benchmarks and
tests that need a far server put this proxy in front of it. Each chunk read from one side is written to the
other ``delay_ms`` later, by a writer that keeps the chunks in order; reading goes on meanwhile, so the delay
adds latency without cutting throughput (a request/response pays 2 x ``delay_ms``, as over a link whose
round trip is 2 x ``delay_ms``).

    python tests/support/delayproxy.py --listen 10.0.0.2:9000 --to 127.0.0.1:9001 --delay-ms 10

With ``--stats-file`` it also counts, for every client, what crossed it: ``requests`` (HTTP requests: chunks from
the client that start with a method; clients here never pipeline, so each request head starts a read) and
``bytes`` (bytes the server sent, headers included), written to the file as JSON at most every 20 ms. So a
benchmark counts the requests and bytes of loaders it cannot instrument (s3fs, Mosaic Streaming, LitData).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time

_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


class _Stats:
    """Requests and response bytes through the proxy, flushed to a JSON file (atomically, rate-limited)."""

    def __init__(self, path: str | None) -> None:
        self.path, self.requests, self.bytes, self._last = path, 0, 0, 0.0

    def count(self, chunk: bytes, to_server: bool) -> None:
        if self.path is None:
            return
        if to_server:
            self.requests += chunk.startswith(_METHODS)
        else:
            self.bytes += len(chunk)
        now = time.monotonic()
        if now - self._last > 0.02:
            self.flush()

    def flush(self) -> None:
        if self.path is None:
            return
        self._last = time.monotonic()
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"requests": self.requests, "bytes": self.bytes}, f)
        os.replace(tmp, self.path)


_stats = _Stats(None)


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, to_server: bool
) -> None:
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = asyncio.Event()
    done = False

    async def send() -> None:
        while True:
            while not queue:
                if done:
                    return
                ready.clear()
                await ready.wait()
            due, chunk = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if chunk:
                writer.write(chunk)
                await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            chunk = await reader.read(1 << 16)
            _stats.count(chunk, to_server)
            queue.append((time.monotonic() + delay_s, chunk))
            ready.set()
            if not chunk:
                break
    except (ConnectionError, OSError):
        pass
    finally:
        done = True
        ready.set()
        try:
            await sender
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


async def _handle(client_r, client_w, to_host: str, to_port: int, delay_s: float) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(to_host, to_port)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(_pump(client_r, server_w, delay_s, True), _pump(server_r, client_w, delay_s, False))
    for w in (client_w, server_w):
        w.close()


async def _serve(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, to[0], to[1], delay_s), listen[0], listen[1], reuse_address=True
    )
    print("ready", flush=True)

    async def flush_idle() -> None:  # the last chunk's counts reach the file even when traffic stops
        while True:
            await asyncio.sleep(0.05)
            _stats.flush()

    flusher = asyncio.create_task(flush_idle()) if _stats.path else None
    async with server:
        await server.serve_forever()
    if flusher is not None:
        flusher.cancel()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", required=True, help="host:port to accept on (a chosen interface)")
    p.add_argument("--to", required=True, help="host:port to forward to")
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction")
    p.add_argument("--stats-file", help="keep request and byte counts in this JSON file")
    args = p.parse_args(argv)
    global _stats
    _stats = _Stats(args.stats_file)
    _stats.flush()
    try:
        asyncio.run(_serve(_addr(args.listen), _addr(args.to), args.delay_ms / 1000.0))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
