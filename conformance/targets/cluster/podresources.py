"""The kubelet's pod-resources API of a cluster node, and its device checkpoint, read typed.

The pod-resources gRPC service (`/v1.PodResourcesLister`, k8s.io/kubelet pkg/apis/podresources/v1)
listens on `<kubelet root>/pod-resources/kubelet.sock` on the node. This machine reaches it
through the node access's view of the node's file system (`local_path`: /proc/<pid>/root of a
kind node container, or of the node's init for a node on this machine), so the answers are the
kubelet's own, decoded here with a small protobuf reader (no generated stubs for one service):

  AllocatableResourcesResponse { repeated ContainerDevices devices = 1; ... }
  ListPodResourcesResponse { repeated PodResources pod_resources = 1 }
  PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3 }
  ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
  ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }

The device manager's checkpoint (`<kubelet root>/device-plugins/kubelet_internal_checkpoint`,
pkg/kubelet/cm/devicemanager/checkpoint: JSON `Data.PodDeviceEntries[].PodUID/ResourceName`)
says which pods hold devices across restarts.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from conformance.targets.cluster.kube import ExecResult

SOCKET = "pod-resources/kubelet.sock"
CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
CALL_TIMEOUT_S = 5.0


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: varints as int, length-delimited as bytes."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((num, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            out.append((num, buf[i : i + size]))
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _strings(buf: bytes, num: int) -> list[str]:
    return [v.decode() for n, v in fields(buf) if n == num and isinstance(v, bytes)]


def _messages(buf: bytes, num: int) -> list[bytes]:
    return [v for n, v in fields(buf) if n == num and isinstance(v, bytes)]


def _devices(buf: bytes, num: int, resource: str) -> tuple[str, ...]:
    ids: list[str] = []
    for dev in _messages(buf, num):
        if (_strings(dev, 1) or [""])[0] == resource:
            ids += _strings(dev, 2)
    return tuple(sorted(ids))


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
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            call = channel.unary_unary(
                f"/v1.PodResourcesLister/{method}",
                request_serializer=lambda _: b"",
                response_deserializer=lambda raw: raw,
            )
            result: bytes = call(b"", timeout=CALL_TIMEOUT_S)
        return result

    def allocatable(self) -> tuple[str, ...]:
        """The device IDs the kubelet considers allocatable (healthy) now."""
        return _devices(self._call("GetAllocatableResources"), 1, self.resource)

    def pods(self) -> list[ListedPod]:
        out = []
        for pod in _messages(self._call("List"), 1):
            name, ns = (_strings(pod, 1) or [""])[0], (_strings(pod, 2) or [""])[0]
            ids = tuple(sorted(i for c in _messages(pod, 3) for i in _devices(c, 2, self.resource)))
            out.append(ListedPod(ns, name, ids))
        return out


# One unary gRPC call over HTTP/2 with the standard library only, run on the node by its own
# python3 when this machine cannot reach the socket (node access through a diagnostic pod): the
# client preface and SETTINGS (large windows: GetAllocatableResources lists every device), the
# request HEADERS (HPACK literals, no table) and the empty message, then the response's DATA until
# END_STREAM; prints "OK <base64 message>", or exits non-zero saying why (Python 3.6+).
H2_CALL = r"""
import base64, socket, struct, sys
path, method = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(path)
def frame(kind, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload
def lit(name, value):
    name, value = name.encode(), value.encode()
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
headers = b"".join(lit(k, v) for k, v in (
    (":method", "POST"), (":scheme", "http"), (":path", "/v1.PodResourcesLister/" + method),
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
        result = self.run(["python3", "-c", H2_CALL, self.socket, method])
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
