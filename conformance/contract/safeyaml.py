"""Reading a user's file safely: bounded, regular files only, strict YAML, short escaped echoes.

Every YAML file the suite reads on a user's behalf (a plugin profile, a manifest, a chart's
values, helm's output) goes through here. `read_bounded` opens without blocking (a FIFO never
hangs the run), refuses anything but a regular file (no device: /dev/zero is never read until
memory runs out) and reads up to a cap. `load_strict` (one document) and `load_strict_all`
(a stream of them) parse YAML with what such a file can mean and nothing else:
- no anchors and no aliases: a few hundred bytes of alias bomb expand to gigabytes in whatever
  walks the result (a deep copy, `kubectl apply`); the stream is scanned for them, and for
  nesting deeper than MAX_DEPTH, before anything is built from it;
- no duplicate keys (the last would silently win), integers of at most MAX_INT_DIGITS digits,
  timestamps left as strings (`2001-13-45` is not a date error);
- a Budget caps what one run reads in all (bytes and objects across every file and helm
  output), so many files under the per-file cap cost no more than one run may.
The limits are strict_json's where both have one, so JSON and YAML input meet the same rules.
libyaml does the scanning when PyYAML has it (several times faster on a large file); the rules
are the same without it. Error lines quote the file only through `excerpt`: escaped, at most a
few dozen characters, so a file that is a symlink to a secret never prints the secret.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hvconform.contract.strict_json import MAX_DEPTH, MAX_INT_DIGITS

try:  # libyaml's parser; the pure-Python one where PyYAML was built without it
    from yaml import CSafeLoader as _Parsing
except ImportError:  # pragma: no cover - PyYAML's Linux wheels carry libyaml
    from yaml import SafeLoader as _Parsing  # type: ignore[assignment]

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENTS",
    "MAX_FILE_BYTES",
    "MAX_INT_DIGITS",
    "MAX_RUN_BYTES",
    "Budget",
    "UnsafeInput",
    "excerpt",
    "load_strict",
    "load_strict_all",
    "read_bounded",
]

# One manifest or values file: the chart's largest is a few KiB; CRDs run to a few hundred.
MAX_FILE_BYTES: Final = 1024 * 1024
# Everything one run reads as Kubernetes objects: every manifest file of a profile together,
# or one helm output. Parsing costs about a second per MiB, so this also bounds the time.
MAX_RUN_BYTES: Final = 4 * 1024 * 1024
# Kubernetes objects one run applies, across every file (the chart renders a dozen).
MAX_DOCUMENTS: Final = 256


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


def read_bounded(path: Path | str, limit: int, *, follow: bool = True) -> bytes:
    """At most `limit` bytes of a regular file; UnsafeInput (one line) otherwise. With
    follow=False a symlink (the last component) is refused instead of read."""
    where = excerpt(str(path), 120)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise UnsafeInput(
                f"{where}: a symlink, refused (it could point anywhere, a secret included)"
            ) from None
        raise UnsafeInput(f"{where}: cannot read: {exc.strerror}") from None
    # fstat before fdopen: fdopen itself raises on a directory (a traceback, not one line)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeInput(f"{where}: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeInput(f"{where}: larger than {limit} bytes")
    return data


@dataclass
class Budget:
    """What one run may still read: every file (and helm output) it parses spends from it."""

    max_bytes: int = MAX_RUN_BYTES
    max_documents: int = MAX_DOCUMENTS
    bytes_used: int = 0
    documents_used: int = 0

    def spend_bytes(self, size: int, where: str) -> None:
        if self.bytes_used + size > self.max_bytes:
            raise UnsafeInput(
                f"{where}: {size} bytes take the run's manifests past {self.max_bytes} bytes "
                "in all (the cap is per run, across every file)"
            )
        self.bytes_used += size


class _StrictLoader(_Parsing):
    """A safe loader without duplicate keys, timestamps or unbounded integers. Anchors, aliases
    and depth are refused by `_scan` before this loader sees the text."""

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


def _line(event: Any) -> int:
    return int(event.start_mark.line) + 1


def _scan(text: str, where: str, budget: Budget | None) -> None:
    """Refuse anchors, aliases, nesting deeper than MAX_DEPTH and (with a budget) more documents
    than it has left, from the event stream: nothing has been built or expanded yet."""
    depth, documents, at_root = 0, 0, False
    for event in yaml.parse(text, Loader=_Parsing):
        if isinstance(event, yaml.NodeEvent):
            if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
                raise yaml.YAMLError(
                    f"line {_line(event)}: anchors and aliases are not allowed (an alias bomb "
                    "of a few hundred bytes expands to gigabytes)"
                )
            if at_root and budget is not None and not _empty(event):
                documents += 1
                if budget.documents_used + documents > budget.max_documents:
                    raise UnsafeInput(
                        f"{where}: more than {budget.max_documents} objects in one run "
                        "(the cap counts every file and helm output of the run)"
                    )
            at_root = False
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise yaml.YAMLError(
                        f"line {_line(event)}: nested deeper than {MAX_DEPTH} levels"
                    )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.DocumentStartEvent):
            at_root = True


def _empty(event: Any) -> bool:
    """An empty document (`---` and nothing): a null, not an object the cap counts."""
    return (
        isinstance(event, yaml.ScalarEvent)
        and event.value == ""
        and event.tag is None
        and bool(event.implicit[0])
    )


def _text(data: bytes | str, where: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafeInput(f"{where}: not UTF-8 text") from None


def _parse(text: str, where: str, budget: Budget | None) -> list[Any]:
    """Every document (a budget given) or the one document (none given) of `text`."""
    try:
        _scan(text, where, budget)
        loader = _StrictLoader(text)
        try:
            if budget is None:
                return [loader.get_single_data()]
            docs = []
            while loader.check_data():  # type: ignore[no-untyped-call]
                docs.append(loader.get_data())
            return docs
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        line = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark is not None else ""
        raise UnsafeInput(f"{where}: not YAML: {line}{exc.problem or 'parse error'}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UnsafeInput(f"{where}: not YAML: {first}") from None


def load_strict(data: bytes, where: str) -> Any:
    """One YAML document of `data`; UnsafeInput naming the line, never quoting the file."""
    return _parse(_text(data, where), where, None)[0]


def load_strict_all(data: bytes | str, where: str, budget: Budget | None = None) -> list[Any]:
    """Every non-empty document of a YAML stream, strictly (the rules above), spending `budget`
    (a fresh one, MAX_RUN_BYTES and MAX_DOCUMENTS, when none is given): UnsafeInput, one line
    naming `where`, the line and the rule, for anything outside them."""
    budget = Budget() if budget is None else budget
    text = _text(data, where)
    budget.spend_bytes(len(text.encode("utf-8")) if isinstance(data, str) else len(data), where)
    docs = [d for d in _parse(text, where, budget) if d is not None]
    budget.documents_used += len(docs)
    return docs
