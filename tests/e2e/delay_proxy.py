"""A TCP proxy that delivers every byte the client sends `--delay` seconds late, the answers at
once: what `tc netem delay` on the inbound path would do (this machine's kernel has no netem).

tests/e2e/test_node_faults.py runs it inside a webhook pod's network namespace, with an
iptables REDIRECT from the webhook's port to `--listen`, so that the API server's calls reach
the webhook through it.

    python3 tests/e2e/delay_proxy.py --listen 18443 --upstream 127.0.0.1:8443 --delay 6
"""

from __future__ import annotations

import argparse
import asyncio
import time


async def delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copies reader to writer, each chunk `delay` seconds after it arrived (order kept)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def read():
        while data := await reader.read(65536):
            await queue.put((time.monotonic() + delay, data))
        await queue.put((time.monotonic() + delay, b""))

    reading = asyncio.create_task(read())
    try:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        reading.cancel()
        writer.close()


async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def serve(port: int, upstream: tuple[str, int], delay: float) -> None:
    async def handle(client_r, client_w):
        print(f"accepted {client_w.get_extra_info('peername')}", flush=True)
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(delayed(client_r, up_w, delay), plain(up_r, client_w), return_exceptions=True)

    server = await asyncio.start_server(handle, "0.0.0.0", port)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="HOST:PORT")
    ap.add_argument("--delay", type=float, required=True, help="seconds")
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    asyncio.run(serve(args.listen, (host, int(port)), args.delay))


if __name__ == "__main__":
    main()
