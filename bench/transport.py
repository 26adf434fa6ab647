"""HTTP transport cost per call: gmp's HttpTransport against the alternatives.

A uvicorn (httptools) server in a separate process answers POST /step with a 2.76 MB body (three
480x640 RGB frames) to a small request; each client makes N calls and the median wall time per
call is reported, with the ratio to HttpTransport. Codec cost is excluded on purpose.

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


def _time(fn: Callable[[], int], calls: int) -> float:
    for _ in range(5):  # warm up (connections, caches)
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        n = fn()
        samples.append(time.perf_counter() - t0)
        assert n == REPLY_BYTES, n
    return statistics.median(samples) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0

    import tempfile

    from genmanip_protocol.transport import HttpTransport

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
            results: list[tuple[str, float]] = []

            t = HttpTransport(url, timeout=30)
            results.append(("gmp HttpTransport (keep-alive)",
                            _time(lambda: len(t.post("/step", body=REQUEST).body), args.calls)))
            t.close()

            conn = http.client.HTTPConnection("127.0.0.1", port)

            def raw() -> int:
                conn.request("POST", "/step", body=REQUEST)
                return len(conn.getresponse().read())

            results.append(("bare http.client (keep-alive)", _time(raw, args.calls)))
            conn.close()

            try:
                import requests
            except ImportError:
                requests = None  # type: ignore[assignment]
            if requests is not None:
                s = requests.Session()
                results.append(("requests.Session (.content)",
                                _time(lambda: len(s.post(url + "/step", data=REQUEST).content), args.calls)))
                s.close()
                results.append(("requests.post, new connection per call (reference client)",
                                _time(lambda: len(requests.post(url + "/step", data=REQUEST).content),
                                      args.calls)))
        finally:
            server.terminate()
            server.wait(10)

    base = results[0][1]
    print(f"Transport: POST /step, {REPLY_BYTES / 1e6:.2f} MB reply, median of {args.calls} calls\n")
    print("| client | ms/call | x HttpTransport |")
    print("|---|---:|---:|")
    for name, ms in results:
        print(f"| {name} | {ms:.2f} | {ms / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
