"""JSON input a person or a program hands the suite, read strictly and within bounds.

Every file the suite reads back (results.json, the run's manifest, metadata snapshots, an older
bench.json) goes through here, so a careless or hostile file is refused with one line naming the
file and the problem, never with a traceback:

- only a regular file is read (a FIFO would block, /dev/zero would fill memory), at most
  MAX_BYTES of it;
- the bytes must be UTF-8 (a binary file is named as such);
- NaN, Infinity and numbers that overflow a float (1e400) are refused: a duration must be finite;
- an integer of more than MAX_INT_DIGITS digits is refused (nothing the suite reads counts that
  high, and a 100,000-digit one costs quadratic time to convert), as is a duplicate key (json
  would silently keep the last value, so two readers could disagree about one file);
- nesting deeper than MAX_DEPTH is refused (json's own recursion guard stops 100,000 brackets
  early; what it lets through is measured without recursion), so nothing after the load can
  recurse out of the stack; a caller may also cap how many values a document holds
  (`max_values`), so the work after the load is bounded by more than its bytes.

These limits are the ones hvconform.contract.safeyaml applies to YAML (it imports them).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 64 * 1024 * 1024  # a results.json of a full run is well under 1 MiB
MAX_DEPTH = 64  # results.json nests 5 levels; nothing the suite writes comes close
MAX_INT_DIGITS = 18  # any int64 of 18 digits; no count, size or id the suite reads is longer


class JsonInputError(ValueError):
    """The input is not usable JSON; str() is one line that names the file and the problem."""


def read_bytes(path: Path, *, label: str, max_bytes: int = MAX_BYTES) -> bytes:
    """The whole content of a regular file of at most max_bytes, read without following a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise JsonInputError(f"{label} {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JsonInputError(f"{label} {path}: not a regular file")
        if st.st_size > max_bytes:
            raise JsonInputError(f"{label} {path}: {st.st_size} bytes, more than {max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise JsonInputError(f"{label} {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise JsonInputError(f"{label} {path}: more than {max_bytes} bytes")
    return data


def decode(data: bytes, *, label: str) -> str:
    """UTF-8 text; a NUL byte or invalid UTF-8 names the file as binary."""
    if b"\x00" in data:
        raise JsonInputError(f"{label}: a binary file (NUL byte at offset {data.index(0)})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonInputError(f"{label}: a binary file (not UTF-8 at byte {exc.start})") from exc


def depth_of(value: Any) -> int:
    """How deeply value nests lists and objects (a scalar is 0), found without recursion."""
    return measure(value)[0]


def measure(value: Any, stop_after: int | None = None) -> tuple[int, int]:
    """(depth, number of values) of a parsed document, found without recursion; the count
    stops growing past `stop_after` (the walk ends there: the caller refuses it anyway)."""
    deepest, count, stack = 0, 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if stop_after is not None and count > stop_after:
            break
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest, count


def _refuse_constant(name: str) -> Any:
    raise JsonInputError(f"{name} is not a number JSON allows (every value must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonInputError(f"{text[:40]} overflows a float (every value must be finite)")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonInputError(
            f"an integer of more than {MAX_INT_DIGITS} digits ({text[:20]}...) is refused"
        )
    return int(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonInputError(f"duplicate key '{one_line(key, 40)}'")
            seen.add(key)
    return found


def parse(
    text: str, *, label: str, max_depth: int = MAX_DEPTH, max_values: int | None = None
) -> Any:
    """Parsed JSON; JsonInputError (one line) for anything outside the rules above."""
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique,
        )
    except JsonInputError as exc:
        raise JsonInputError(f"{label}: {exc}") from None
    except RecursionError:  # json's C scanner stops itself at the interpreter's limit
        raise JsonInputError(f"{label}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # json.JSONDecodeError, or an integer over Python's digit limit
        raise JsonInputError(f"{label}: not JSON: {one_line(str(exc))}") from None
    depth, count = measure(value, max_values)
    if depth > max_depth:
        raise JsonInputError(f"{label}: nested deeper than {max_depth} levels")
    if max_values is not None and count > max_values:
        raise JsonInputError(f"{label}: more than {max_values} values")
    return value


def load(
    path: Path, *, label: str, max_bytes: int = MAX_BYTES, max_values: int | None = None
) -> Any:
    """read_bytes + decode + parse: one call for a JSON file handed to the suite."""
    text = decode(read_bytes(path, label=label, max_bytes=max_bytes), label=f"{label} {path}")
    return parse(text, label=f"{label} {path}", max_values=max_values)


def one_line(text: str, limit: int = 300) -> str:
    """A message on one line of bounded length, control characters shown as \\xNN."""
    flat = " ".join(text.split())
    shown = "".join(c if c.isprintable() else _escaped(c) for c in flat)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _escaped(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )
