"""The kubelet's pod-resources API of a cluster node, and its device checkpoint, read typed.

The pod-resources gRPC service (`/v1.PodResourcesLister`, k8s.io/kubelet pkg/apis/podresources/v1)
listens on `<kubelet root>/pod-resources/kubelet.sock` on the node. This machine reaches it
through the node access's view of the node's file system (`local_path`: /proc/<pid>/root of a
kind node container, or of the node's init for a node on this machine), so the answers are the
kubelet's own, decoded by hvconform.contract.podresources (the wire facts are there).

The device manager's checkpoint (`<kubelet root>/device-plugins/kubelet_internal_checkpoint`,
pkg/kubelet/cm/devicemanager/checkpoint: JSON `Data.PodDeviceEntries[].PodUID/ResourceName`)
says which pods hold devices across restarts.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass

from hvconform.contract.podresources import SERVICE_PATH, call, devices, listed_pods
from hvconform.targets.cluster.kube import ExecResult

SOCKET = "pod-resources/kubelet.sock"
CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
CALL_TIMEOUT_S = 5.0


def _devices(buf: bytes, num: int, resource: str) -> tuple[str, ...]:
    """One resource's device IDs among the ContainerDevices of field `num`, sorted."""
    return tuple(sorted(devices(buf, num).get(resource, [])))


@dataclass(frozen=True)
class ListedPod:
    namespace: str
    name: str
    devices: tuple[str, ...]  # the resource's device IDs over all its containers


class PodResourcesClient:
    """List and GetAllocatableResources for one resource, on the kubelet's socket."""

    def __init__(self, socket: str, resource: str) -> None:
        self.socket = socket
        self.resource = resource

    def _call(self, method: str) -> bytes:
        return call(self.socket, method, CALL_TIMEOUT_S)

    def allocatable(self) -> tuple[str, ...]:
        """The device IDs the kubelet considers allocatable (healthy) now."""
        return _devices(self._call("GetAllocatableResources"), 1, self.resource)

    def pods(self) -> list[ListedPod]:
        by_pod: dict[tuple[str, str], list[str]] = {}
        for c in listed_pods(self._call("List")):  # per container: the pod's over all of them
            by_pod.setdefault((c.namespace, c.name), []).extend(c.devices.get(self.resource, []))
        return [ListedPod(ns, name, tuple(sorted(ids))) for (ns, name), ids in by_pod.items()]


# One unary gRPC call over HTTP/2 with the standard library only, run on the node by its own
# python3 when this machine cannot reach the socket (node access through a diagnostic pod): the
# client preface and SETTINGS (large windows: GetAllocatableResources lists every device), the
# request HEADERS (HPACK literals, no table) and the empty message, then the response's DATA until
# END_STREAM; prints "OK <base64 message>", or exits non-zero saying why (Python 3.6+).
H2_CALL = r"""
import base64, socket, struct, sys
path, method = sys.argv[1], sys.argv[2]  # method: the whole gRPC path
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(path)
def frame(kind, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload
def lit(name, value):
    name, value = name.encode(), value.encode()
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
headers = b"".join(lit(k, v) for k, v in (
    (":method", "POST"), (":scheme", "http"), (":path", method),
    (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")))
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, struct.pack(">HI", 4, 1 << 30))
          + frame(8, 0, 0, struct.pack(">I", 1 << 30)) + frame(1, 4, 1, headers)
          + frame(0, 1, 1, b"\x00\x00\x00\x00\x00"))
buf, data, seen = b"", b"", False
def read(n):
    global buf
    while len(buf) < n:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("connection closed by the kubelet")
        buf += chunk
    out, buf = buf[:n], buf[n:]
    return out
while True:
    head = read(9)
    kind, flags = head[3], head[4]
    sid = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
    payload = read(int.from_bytes(head[:3], "big"))
    if kind == 4 and not flags & 1:
        s.sendall(frame(4, 1, 0))
    elif kind == 7:
        sys.exit("GOAWAY from the kubelet")
    elif kind == 3 and sid == 1:
        sys.exit("stream reset by the kubelet")
    elif kind == 0 and sid == 1:
        pad = payload[0] if flags & 8 else 0
        data += payload[1 if flags & 8 else 0:len(payload) - pad]
        seen = True
    if sid == 1 and flags & 1 and kind in (0, 1):
        break
if not seen:
    sys.exit("no message: the call failed (grpc-status in the trailers)")
print("OK " + base64.b64encode(data[5:]).decode())
"""


class NodePodResources(PodResourcesClient):
    """The same calls made where `run` runs argv (the node, or the diagnostic pod), by H2_CALL
    under that side's python3."""

    def __init__(self, run: Callable[[list[str]], ExecResult], socket: str, resource: str) -> None:
        super().__init__(socket, resource)
        self.run = run

    def _call(self, method: str) -> bytes:
        result = self.run(["python3", "-c", H2_CALL, self.socket, SERVICE_PATH + method])
        head, _, body = result.stdout.decode().strip().partition(" ")
        if result.rc != 0 or head != "OK":
            raise RuntimeError(
                f"pod-resources {method} on the node: "
                f"{result.stderr.decode(errors='replace').strip()[-300:] or 'no answer'}"
            )
        return base64.b64decode(body)


def checkpoint_pods(data: bytes | None, resource: str) -> set[str]:
    """The pod UIDs the device manager's checkpoint assigns devices of `resource` to."""
    if not data:
        return set()
    entries = json.loads(data).get("Data", {}).get("PodDeviceEntries") or []
    return {str(e.get("PodUID", "")) for e in entries if e.get("ResourceName") == resource}
