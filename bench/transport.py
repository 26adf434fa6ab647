"""HTTP transport cost per call: gmp's HttpTransport against the alternatives.

A uvicorn (httptools) server in a separate process answers POST /step with a 2.76 MB body (three
480x640 RGB frames) to a small request; the clients take turns, 10 calls each, until each made N calls, and the median
wall time per call is reported, with the ratio to HttpTransport. Codec cost is excluded on purpose.

Usage: python bench/transport.py [--calls N]
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

REPLY_BYTES = 3 * 480 * 640 * 3
REQUEST = b"x" * 200


def serve(port_file: str) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    payload = bytes(REPLY_BYTES)

    async def step(request: Request) -> Response:
        await request.body()
        return Response(payload, media_type="application/octet-stream")

    app = Starlette(routes=[Route("/step", step, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with open(port_file, "w") as fh:
        fh.write(str(port))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="httptools",
                lifespan="off")


def _time_round_robin(clients: list[tuple[str, Callable[[], int]]], calls: int) -> list[tuple[str, float]]:
    """Median ms per call of each client, measured in interleaved rounds of 10 calls so that the
    machine's drift hits every client alike."""
    for _, fn in clients:
        for _ in range(5):  # warm up (connections, caches)
            fn()
    samples: dict[str, list[float]] = {name: [] for name, _ in clients}
    for _ in range(max(1, calls // 10)):
        for name, fn in clients:
            for _ in range(10):
                t0 = time.perf_counter()
                n = fn()
                samples[name].append(time.perf_counter() - t0)
                assert n == REPLY_BYTES, (name, n)
    return [(name, statistics.median(samples[name]) * 1000) for name, _ in clients]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0

    import tempfile

    from genmanip_runtime.transport import HttpTransport

    with tempfile.TemporaryDirectory() as tmp:
        port_file = f"{tmp}/port"
        server = subprocess.Popen([sys.executable, __file__, "--serve", port_file])
        try:
            deadline = time.monotonic() + 30
            port = None
            while port is None:
                if time.monotonic() > deadline:
                    raise SystemExit("server did not start")
                try:
                    port = int(open(port_file).read())
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except (OSError, ValueError):
                    port = None
                    time.sleep(0.1)
            url = f"http://127.0.0.1:{port}"
            skipped: list[str] = []

            clients: list[tuple[str, Callable[[], int]]] = []
            closers: list[Callable[[], None]] = []
            t = HttpTransport(url, timeout=30)
            clients.append(("gmp HttpTransport (keep-alive)", lambda: len(t.post("/step", body=REQUEST).body)))
            closers.append(t.close)

            conn = http.client.HTTPConnection("127.0.0.1", port)

            def raw() -> int:
                conn.request("POST", "/step", body=REQUEST)
                return len(conn.getresponse().read())

            clients.append(("bare http.client (keep-alive)", raw))
            closers.append(conn.close)

            try:
                import urllib3
            except ImportError:
                skipped.append("urllib3")
            else:
                pool = urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=1)
                clients.append(("urllib3 pool (keep-alive)",
                                lambda: len(pool.request("POST", "/step", body=REQUEST).data)))
                closers.append(pool.close)

            try:
                import httpx
            except ImportError:
                skipped.append("httpx")
            else:
                hc = httpx.Client(base_url=url)
                clients.append(("httpx.Client (keep-alive)",
                                lambda: len(hc.post("/step", content=REQUEST).content)))
                closers.append(hc.close)

            try:
                import requests
            except ImportError:
                skipped.append("requests")
            else:
                rs = requests.Session()
                clients.append(("requests.Session (.content)",
                                lambda: len(rs.post(url + "/step", data=REQUEST).content)))
                closers.append(rs.close)
                clients.append(("requests.post, new connection per call (reference client)",
                                lambda: len(requests.post(url + "/step", data=REQUEST).content)))
            results = _time_round_robin(clients, args.calls)
            for close in closers:
                close()
        finally:
            server.terminate()
            server.wait(10)

    base = results[0][1]
    print(f"Transport: POST /step, {REPLY_BYTES / 1e6:.2f} MB reply, median of {args.calls} calls\n")
    print("| client | ms/call | x HttpTransport |")
    print("|---|---:|---:|")
    for name, ms in results:
        print(f"| {name} | {ms:.2f} | {ms / base:.2f} |")
    if skipped:
        print(f"\nnot installed, not measured: {', '.join(skipped)} (`hatch run bench` has them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
