"""Connections that hold a slot of the webhook without making progress (for faults.sh).

    python3 benches/holders.py SHAPE COUNT SECONDS [PORT]

SHAPE: h2-no-preface (ALPN h2, then nothing), h1-no-body (headers, a body never sent),
h1-trickle (headers, then a body byte every 300 ms), h2-idle (one request, then only the
answers to the server's pings; needs the h2 package). Each holder reconnects when cut, until
SECONDS are over; the last line printed is how many were opened and how many the server cut.
"""

import asyncio
import ssl
import sys
import time

shape, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
port = int(sys.argv[4]) if len(sys.argv) > 4 else 443
end = time.monotonic() + seconds
stats = {"opened": 0, "cut": 0}
HEAD = (b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4000\r\n\r\n")


def context(alpn):
    # No verification, so no CA store to load (that load costs more than the handshake).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    return ctx


CONTEXTS = {alpn: context(alpn) for alpn in ("h2", "http/1.1")}


async def until_cut(reader):
    try:
        await asyncio.wait_for(reader.read(), max(0.0, end - time.monotonic()))
        stats["cut"] += 1
    except (asyncio.TimeoutError, OSError, ssl.SSLError):
        pass


async def holder():
    while time.monotonic() < end:
        try:
            alpn = "h2" if shape.startswith("h2") else "http/1.1"
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=CONTEXTS[alpn], server_hostname="localhost")
            stats["opened"] += 1
            if shape == "h2-no-preface":
                await until_cut(r)
            elif shape == "h1-no-body":
                w.write(HEAD)
                await w.drain()
                await until_cut(r)
            elif shape == "h1-trickle":
                w.write(HEAD)
                await w.drain()
                while time.monotonic() < end and not r.at_eof():
                    w.write(b" ")
                    await w.drain()
                    try:
                        if await asyncio.wait_for(r.read(1024), 0.3):
                            stats["cut"] += 1  # the 408
                            break
                    except asyncio.TimeoutError:
                        pass
            elif shape == "h2-idle":
                await h2_idle(r, w)
            w.close()
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError):
            await asyncio.sleep(0.1)


async def h2_idle(r, w):
    import h2.config
    import h2.connection
    import h2.events
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":path", "/healthz"), (":scheme", "https"),
                            (":authority", "localhost")], end_stream=True)
    w.write(conn.data_to_send())
    await w.drain()
    while time.monotonic() < end:
        try:
            data = await asyncio.wait_for(r.read(65536), max(0.01, end - time.monotonic()))
        except asyncio.TimeoutError:
            return
        if not data:
            stats["cut"] += 1
            return
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ConnectionTerminated):
                stats["cut"] += 1
                return
        w.write(conn.data_to_send())  # ping acks
        await w.drain()


async def main():
    await asyncio.gather(*[holder() for _ in range(count)])


asyncio.run(main())
print(stats)
