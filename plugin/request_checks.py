"""Checks of the kubelet's requests before any work is done for them.

The kubelet never names more device IDs than the node's capacity (--slots) and never the same
one twice, so a request beyond that is refused at once with INVALID_ARGUMENT. Sizes are
checked before anything is iterated, so every check costs at most O(--slots) on the event loop
whatever the request holds, and every refusal message is bounded: the first few IDs (each cut
short, escaped) and a count, never the request itself.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError

from hv_device_plugin.api import deviceplugin_pb2 as pb

M = TypeVar("M")

MAX_SHOWN_IDS = 5
MAX_SHOWN_ID_CHARS = 40
# Shown as they are; any other ID is quoted and escaped, so control characters stay visible.
_PLAIN_ID = re.compile(rf"[A-Za-z0-9._:=-]{{1,{MAX_SHOWN_ID_CHARS}}}")


def _show_id(device_id: str) -> str:
    if _PLAIN_ID.fullmatch(device_id):
        return device_id
    if len(device_id) <= MAX_SHOWN_ID_CHARS:
        return repr(device_id)
    return f"{device_id[:MAX_SHOWN_ID_CHARS]!r}...({len(device_id)} characters)"


def show_ids(ids: Iterable[str], total: int) -> str:
    """kvm-0, 'a b' and 12 more: at most MAX_SHOWN_IDS IDs, odd ones escaped and cut short."""
    shown = [_show_id(i) for i in itertools.islice(ids, MAX_SHOWN_IDS)]
    more = total - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class Unread:
    """A request refused from its bytes alone, never parsed: too large to be valid, or garbled."""

    reason: str


def max_allocate_bytes(known: Collection[str]) -> int:
    """More than the largest valid Allocate can take: every known ID once (tag, length, bytes),
    each in a container request of its own (tag and length)."""
    return sum(len(device_id.encode()) + 4 for device_id in known) + 8 * len(known)


def reader(parse: Callable[[bytes], M], limit: int, what: str) -> Callable[[bytes], M | Unread]:
    """A gRPC request deserializer that refuses a request over `limit` bytes before parsing
    it (parsing megabytes holds the event loop) and turns garbled bytes into a refusal."""

    def read(raw: bytes) -> M | Unread:
        if len(raw) > limit:
            return Unread(
                f"{what} of {len(raw)} bytes: larger than any valid one for this node's "
                f"device IDs (at most {limit} bytes)"
            )
        try:
            return parse(raw)
        except DecodeError:
            return Unread(f"{what} of {len(raw)} bytes is not a valid protobuf message")

    return read


def allocate_problem(
    request: pb.AllocateRequest | Unread, known: frozenset[str], limit: int
) -> str:
    """Why an Allocate is refused ("" when it is valid): at most `limit` IDs in all, each
    known, none named twice in the whole request, every container request naming one."""
    if isinstance(request, Unread):
        return request.reason
    containers = request.container_requests
    if not containers:
        return "no container requests"
    if len(containers) > limit:
        return f"{len(containers)} container requests: at most {limit} (the node's capacity)"
    total = sum(len(c.devices_ids) for c in containers)
    if total > limit:
        return (
            f"{total} device IDs requested: at most {limit} in one request "
            "(the node's capacity, --slots)"
        )
    if any(not c.devices_ids for c in containers):
        return "a container request has no device IDs"
    seen: set[str] = set()
    unknown: list[str] = []
    repeated: list[str] = []
    for container in containers:
        for device_id in container.devices_ids:
            if device_id not in known:
                unknown.append(device_id)
            elif device_id in seen:
                repeated.append(device_id)
            else:
                seen.add(device_id)
    if unknown:
        return f"unknown device IDs: {show_ids(unknown, len(unknown))}"
    if repeated:
        distinct = list(dict.fromkeys(repeated))
        return f"duplicate device IDs: {show_ids(distinct, len(distinct))}"
    return ""


def preferred_problem(request: pb.PreferredAllocationRequest | Unread, limit: int) -> str:
    """Why a GetPreferredAllocation is refused ("" when its sizes are within the capacity)."""
    if isinstance(request, Unread):
        return request.reason
    containers = request.container_requests
    if len(containers) > limit:
        return f"{len(containers)} container requests: at most {limit} (the node's capacity)"
    available = sum(len(c.available_deviceIDs) for c in containers)
    must = sum(len(c.must_include_deviceIDs) for c in containers)
    if available > limit or must > limit:
        return (
            f"{available} available and {must} required device IDs: at most {limit} each "
            "(the node's capacity, --slots)"
        )
    sizes = [c.allocation_size for c in containers]
    if any(not 0 <= size <= limit for size in sizes):
        bad = next(size for size in sizes if not 0 <= size <= limit)
        return f"allocation size {bad}: must be 0 to {limit}"
    return ""
