"""`python -m tests.plugin.healthz_sampler PORT COUNT`: /healthz latencies as one JSON list.

A process of its own, so that the load the test generates in its threads cannot delay the
sampler's own requests (one GIL): what is measured is the plugin's answer time.
"""

from __future__ import annotations

import json
import socket
import sys
import time

# Pacing between samples, so that they spread over the load rather than bunch together.
PACE_S = 0.005


def healthz_once(port: int) -> float:
    """One GET /healthz on a fresh connection; seconds until the whole answer arrived."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    elapsed = time.perf_counter() - started
    if not answer.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"/healthz answered {answer[:100]!r}")
    return elapsed


def main(argv: list[str]) -> int:
    port, count = int(argv[0]), int(argv[1])
    samples = []
    for _ in range(count):
        samples.append(healthz_once(port))
        time.sleep(PACE_S)
    print(json.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
