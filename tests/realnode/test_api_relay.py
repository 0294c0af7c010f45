"""The API relay in this host's namespace (cluster-mode nodes' `kubernetes` Service address):
real sockets, a real upstream; what goes in comes out, both ways, and close() leaves nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from hvconform.targets.realnode.api_relay import ApiRelay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def upstream() -> Iterator[int]:
    """An echo server on 127.0.0.1 (the API server's place), answering upper-cased."""
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not on Linux)
    server.close()
    thread.join(5)
    assert not thread.is_alive()


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = conn.recv(65536)
            assert chunk, "the relay closed the connection early"
            got += chunk
        return got


def test_the_host_relay_copies_both_ways_and_closes_clean(upstream: int) -> None:
    listen = _free_port()
    relay = ApiRelay(None, upstream, ("127.0.0.1", listen))
    try:
        payload = b"hello-" * 20000  # larger than one chunk each way
        assert _exchange(listen, payload) == payload.upper()
        assert _exchange(listen, b"again") == b"AGAIN"
        assert relay.connections == 2
    finally:
        assert relay.close() == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", listen), timeout=2).close()


def test_the_relay_process_stops_on_sigterm(upstream: int) -> None:
    listen = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvconform.targets.realnode.api_relay",
         "--listen", f"127.0.0.1:{listen}", "--api-port", str(upstream)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        from hvconform.contract.wait import wait_for

        def answers() -> bool:
            try:
                return _exchange(listen, b"up") == b"UP"
            except OSError:
                return False

        wait_for(answers, 20, "the relay process answering")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
