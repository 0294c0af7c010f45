"""Reading a user's file safely: bounded, regular files only, strict YAML, short escaped echoes.

Every file the suite reads on a user's behalf (a plugin profile, a manifest, values) goes
through `read_bounded`: opened without blocking (a FIFO never hangs the run), refused unless it
is a regular file (no device: /dev/zero is never read until memory runs out), read up to a cap.
`load_strict` parses YAML with what a profile can mean and nothing else: no aliases (a few
hundred bytes of alias bomb expand to gigabytes), no duplicate keys (the last would silently
win), timestamps left as strings (`2001-13-45` is not a date error), integers of at most 18
digits. Error lines quote the file only through `excerpt`: escaped, at most a few dozen
characters, so a profile that is a symlink to a secret never prints the secret.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_INT_DIGITS = 18


class UnsafeInput(ValueError):
    """The file cannot be read or parsed safely; one line, no content beyond an excerpt."""


def excerpt(value: object, limit: int = 40) -> str:
    """`value` as a short, escaped, single-line quote for an error message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"  # repr() of it could raise
    text = value if isinstance(value, str) else repr(value)
    cut = text[:limit]
    escaped = cut.encode("unicode_escape", "backslashreplace").decode("ascii").replace("'", "\\'")
    return f"'{escaped}'" + ("..." if len(text) > limit else "")


def read_bounded(path: Path | str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; UnsafeInput (one line) otherwise."""
    where = excerpt(str(path), 120)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeInput(f"{where}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeInput(f"{where}: not a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeInput(f"{where}: larger than {limit} bytes")
    return data


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases, duplicate keys, timestamps or unbounded integers."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.YAMLError(f"line {event.start_mark.line + 1}: aliases are not allowed")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.YAMLError(
                    f"line {key_node.start_mark.line + 1}: a key must be a plain value"
                ) from None
            if duplicate:
                raise yaml.YAMLError(
                    f"line {key_node.start_mark.line + 1}: duplicate key {excerpt(key)}"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> Any:
        # every digit of any base counts (0x..., 0o..., 1_000): a hex literal is no smaller
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.YAMLError(
                f"line {node.start_mark.line + 1}: an integer of more than {MAX_INT_DIGITS} digits"
            )
        return super().construct_yaml_int(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
# Timestamps stay strings: a profile has no dates, and `name: 2001-13-45` must not be an error.
_StrictLoader.add_constructor(
    "tag:yaml.org,2002:timestamp",
    _StrictLoader.construct_yaml_str,  # type: ignore[type-var]
)


def load_strict(data: bytes, where: str) -> Any:
    """One YAML document of `data`; UnsafeInput naming the line, never quoting the file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafeInput(f"{where}: not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        line = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark is not None else ""
        raise UnsafeInput(f"{where}: not YAML: {line}{exc.problem or 'parse error'}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UnsafeInput(f"{where}: not YAML: {first}") from None
