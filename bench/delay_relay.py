#!/usr/bin/env python3
"""A TCP relay that holds every byte DELAY_MS milliseconds in each direction, in order.

The hop latency of bench/lookahead_bench.sh. This machine's kernel has no netem qdisc
(`tc qdisc add ... netem` fails: "Specified qdisc kind is unknown"), so the delay is made
in user space: each chunk read from one side is stamped and written to the other side once
its time has come. Bytes keep their order; the bandwidth is not limited.

Usage: delay_relay.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS
"""
import asyncio
import socket
import sys
import time


async def pipe(reader, writer, delay):
    queue = asyncio.Queue()

    async def read():
        try:
            while True:
                data = await reader.read(1 << 16)
                await queue.put((time.monotonic() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((time.monotonic(), b""))

    async def write():
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    await asyncio.gather(read(), write())


async def main():
    listen, target, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)
    delay = delay_ms / 1000.0

    async def serve(client_reader, client_writer):
        try:
            up_reader, up_writer = await asyncio.open_connection(thost, int(tport))
        except OSError:
            client_writer.close()
            return
        for w in (client_writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(client_reader, up_writer, delay), pipe(up_reader, client_writer, delay))

    server = await asyncio.start_server(serve, lhost, int(lport))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main())
