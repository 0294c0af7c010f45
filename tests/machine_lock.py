"""One machine-wide lock for tests that share something of the host (the node stack, the
bench's /tmp/hvb-* dirs): pytest-xdist puts each file on its own worker."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator


@contextlib.contextmanager
def machine_lock(path: str) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
