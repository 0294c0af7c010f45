"""The API server reached from inside the plugin sandbox's network namespace.

A DRA driver talks to the API server (its ResourceSlice, the claims it prepares). On the real
node the API server listens on this host's loopback only, and the driver runs in its sandbox's
own network namespace, where 127.0.0.1 is its own. This relay listens on 127.0.0.1:<port>
*inside* that namespace and copies each connection to the same port on this host's loopback:
the driver's kubeconfig says https://127.0.0.1:<port>, as the API server's certificate does,
so TLS is end to end between the driver and the API server (the relay sees ciphertext only) and
no address of this host is opened to anything else.

The listening socket is made by a short-lived thread that enters the namespace (setns applies
to the calling thread only); every other socket is made in this host's namespace. close() ends
every connection and joins every thread: nothing outlives the node.

Cluster-mode nodes (`node-up --nodes N`) run it as a process of its own, in this host's
namespace: it listens on the `kubernetes` Service's address (SERVICE_IP, on lo while the nodes
are up) at 443 and copies to the API server, so a pod's in-cluster configuration
(KUBERNETES_SERVICE_HOST, the service-account CA) reaches the API server as it does through a
service proxy on any cluster: a DRA driver's DaemonSet runs there unchanged, without the host's
network. The API server's certificate names SERVICE_IP.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import socket
import threading
from pathlib import Path

_CLONE_NEWNET = 0x40000000
_CHUNK = 64 * 1024


def _listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(16)
    return sock


def _listen_in(netns: Path, port: int) -> socket.socket:
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def inside() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            made.append(_listen("127.0.0.1", port))
        except BaseException as exc:
            failed.append(exc)
        finally:
            os.close(fd)

    # The thread ends in the namespace it entered; its socket stays there, usable from any.
    thread = threading.Thread(target=inside, name="api-relay-setns")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


class ApiRelay:
    """netns: listen on 127.0.0.1:port inside it; None: on `listen` (address, port) here."""

    def __init__(self, netns: Path | None, port: int, listen: tuple[str, int] = ("", 0)) -> None:
        self.netns, self.port = netns, port
        self._listener = _listen_in(netns, port) if netns is not None else _listen(*listen)
        self._stop_r, self._stop_w = os.pipe()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.connections = 0
        self._accepting = threading.Thread(target=self._accept, name="api-relay", daemon=True)
        self._accepting.start()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            ready, _, _ = select.select([self._listener.fileno(), self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                inner, _ = self._listener.accept()
            except OSError:
                continue
            self.connections += 1
            self._spawn(self._pump, inner)

    def _pump(self, inner: socket.socket) -> None:
        try:
            outer = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError:
            inner.close()
            return
        outer.settimeout(None)
        pair = {inner.fileno(): (inner, outer), outer.fileno(): (outer, inner)}
        try:
            while True:
                ready, _, _ = select.select([*pair, self._stop_r], [], [])
                if self._stop_r in ready:
                    return
                for fd in ready:
                    src, dst = pair[fd]
                    data = src.recv(_CHUNK)
                    if not data:
                        return
                    dst.sendall(data)
        except OSError:
            return
        finally:
            inner.close()
            outer.close()

    def close(self) -> list[str]:
        """Stop: every connection ended, every thread joined; what is left, named."""
        os.write(self._stop_w, b"x")
        self._accepting.join(10)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(10)
        self._listener.close()
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        alive = [t.name for t in (self._accepting, *threads) if t.is_alive()]
        return [f"API relay thread {name} still running" for name in alive]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hv-api-relay", description="Copy TCP connections on ADDRESS:PORT to the API server."
    )
    parser.add_argument("--listen", required=True, metavar="ADDRESS:PORT")
    parser.add_argument("--api-port", required=True, type=int, help="the API server's, on lo")
    args = parser.parse_args(argv)
    address, _, port = args.listen.rpartition(":")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop.set())
    relay = ApiRelay(None, args.api_port, (address, int(port)))
    stop.wait()
    left = relay.close()
    for line in left:
        print(line, flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
