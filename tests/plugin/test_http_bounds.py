"""The health port under oversize requests: 431 and one JSON log line, never a traceback."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from hv_device_plugin.endpoints import MAX_HEAD_BYTES
from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import Node, PluginProcess, wait_for

REFUSED_EVENT = "http_request_refused"


def _exchange(port: int, data: bytes) -> tuple[bytes, float]:
    """Send `data` whole (the server may answer before it has read it all), then read the
    answer to its end; and the seconds from the first byte sent to the last byte read."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        # Refused before everything was sent: the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(data)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer, time.perf_counter() - started


def _head(target: str, *headers: str) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


def head_of(size: int, shape: str) -> bytes:
    """A request whose head (everything before the blank line) is exactly `size` bytes."""
    if shape == "request line":
        prefix, headers = "/healthz?q=", []
    elif shape == "one header":
        prefix, headers = "/healthz", ["X-Big: "]
    else:  # lines of 100 bytes each, and one to make up the rest
        prefix = "/healthz"
        headers = [f"X-{i:05d}: {'b' * 89}" for i in range(size // 100 - 2)] + ["X-Last: "]
    fixed = len(_head(prefix, *headers)) - 4
    filler = "a" * (size - fixed)
    if shape == "request line":
        data = _head(prefix + filler, *headers)
    else:
        data = _head(prefix, *headers[:-1], headers[-1] + filler)
    assert len(data) - 4 == size
    return data


@pytest.fixture
def served(node: Node, kubelet: KubeletStub) -> Iterator[PluginProcess]:
    proc = PluginProcess(node, kubelet)
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log_path.read_text()[-4000:]
    text = proc.log_path.read_text()
    assert "Traceback" not in text
    for line in text.splitlines():
        json.loads(line)  # every line on stderr is a JSON object


SHAPES = ("request line", "one header", "many headers")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("size", [MAX_HEAD_BYTES + 5, 70 * 1024, 1024 * 1024])
def test_oversize_head_answered_431_with_one_log_line(
    served: PluginProcess, shape: str, size: int
) -> None:
    data = head_of(size, shape)
    before = sum(1 for e in served.events() if e.get("event") == REFUSED_EVENT)
    answer, took = _exchange(served.port, data)
    status = answer.split(b"\r\n", 1)[0]
    print(f"{shape}, {len(data)} bytes: {status.decode()} in {took * 1000:.1f} ms")
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
    refused = wait_for(
        lambda: [e for e in served.events() if e.get("event") == REFUSED_EVENT][before:],
        10,
        "the refusal's log line",
    )
    assert len(refused) == 1 and refused[0]["status"] == 431, refused
    assert served.http("/healthz")[0] == 200, "the endpoints still answer"


@pytest.mark.parametrize("shape", SHAPES)
def test_head_at_the_bound_is_served(served: PluginProcess, shape: str) -> None:
    data = head_of(MAX_HEAD_BYTES, shape)
    answer, _ = _exchange(served.port, data)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
    assert not [e for e in served.events() if e.get("event") == REFUSED_EVENT]
