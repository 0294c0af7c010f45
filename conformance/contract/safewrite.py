"""Every file the suite writes goes through here: a fresh temporary file, then a rename.

The temporary file is created with O_CREAT|O_EXCL|O_NOFOLLOW under a random name beside the
destination, so a symlink or a file someone planted at a predictable `NAME.tmp` is never
followed nor overwritten (a run into a directory another user can write must not let them
redirect root's writes), and the rename replaces the destination name itself, never what a
symlink there points to. Readers see the old file or the whole new one, never a part.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block ends without an exception."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Write `data` (text is UTF-8) to `path` through a fresh temporary file; returns path."""
    with atomic_file(path, mode) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path
