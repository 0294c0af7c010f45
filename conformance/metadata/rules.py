"""Two-phase host device metadata check: snapshots, rules and verdicts (no CLI here).

A bind-mounted /dev/kvm is the host's own inode, so a KIND node's udev may chgrp the HOST's
device to the node's kvm group when the node starts. Phase one (startup) accepts the metadata
unchanged, or with ONLY the gid changed and only to the node's kvm group. Phase two (final, after
plugin testing and cleanup) requires the validated snapshot exactly, or the original one when
startup validation did not complete. A missing or non-character device is rejected in both.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hvconform.contract import strict_json

SCHEMA = "hvconform.device-metadata"
VERSION = 1
MISSING = "missing"
CHAR = "char"
MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to chown, so it is never a real owner
MAX_DEVNUM = 2**32 - 1
SNAPSHOT_MAX_BYTES = 1024 * 1024  # a snapshot is ~200 bytes; a group file a few KiB
KINDS = (CHAR, "block", "file", "dir", "symlink", "fifo", "socket", "other", MISSING)
_STAT_KINDS = (
    (stat.S_ISCHR, CHAR),
    (stat.S_ISBLK, "block"),
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
)
_NUMBER_FIELDS = ("major", "minor", "mode", "uid", "gid")
_MODE = re.compile(r"[0-7]{4}")
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,9}")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?")

DEVICE_RULE = "the device must exist as a character device in every phase"
STARTUP_RULE = "startup may change only the gid, and only to the node's kvm group"
FINAL_RULE = "plugin testing and cleanup must preserve the {ref} metadata exactly"
INCOMPLETE = " (startup validation did not complete)"

Phase = Literal["startup", "final"]
Status = Literal["accepted", "rejected", "error"]


class MetadataInputError(ValueError):
    """Unusable input: unreadable or malformed snapshot or lookup, inconsistent arguments."""


@dataclass(frozen=True)
class Snapshot:
    """Type, device numbers, permission bits and owner of one path (None fields when missing)."""

    path: str
    kind: str
    major: int | None = None
    minor: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    @property
    def exists(self) -> bool:
        return self.kind != MISSING

    def shown(self, name: str) -> str:
        """One field as messages print it (mode in octal, like ls and chmod)."""
        value = self.kind if name == "type" else getattr(self, name)
        return f"{value:04o}" if name == "mode" and value is not None else str(value)

    def describe(self) -> str:
        if not self.exists:
            return MISSING
        numbers = f"{self.major}:{self.minor}"
        return f"{self.kind} {numbers} mode {self.shown('mode')} uid {self.uid} gid {self.gid}"

    def to_json(self) -> dict[str, Any]:
        mode = None if self.mode is None else f"{self.mode:04o}"
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "path": self.path,
            "type": self.kind,
            "major": self.major,
            "minor": self.minor,
            "mode": mode,
            "uid": self.uid,
            "gid": self.gid,
        }

    @classmethod
    def from_json(cls, data: object) -> Snapshot:
        """Strict parse: every key present, nothing extra, values in range."""
        if not isinstance(data, dict):
            raise MetadataInputError("snapshot is not a JSON object")
        keys = set(data)
        want = {"schema", "version", "path", "type", *_NUMBER_FIELDS}
        if keys != want:
            raise MetadataInputError(f"snapshot keys {sorted(keys)} != {sorted(want)}")
        if data["schema"] != SCHEMA or data["version"] != VERSION:
            raise MetadataInputError(
                f"snapshot schema {data['schema']!r} version {data['version']!r} is not "
                f"{SCHEMA!r} version {VERSION}"
            )
        path, kind = data["path"], data["type"]
        if not isinstance(path, str) or not path.startswith("/"):
            raise MetadataInputError(f"snapshot path {path!r} is not absolute")
        if kind not in KINDS:
            raise MetadataInputError(f"snapshot type {kind!r} is not one of {', '.join(KINDS)}")
        if kind == MISSING:
            if any(data[name] is not None for name in _NUMBER_FIELDS):
                raise MetadataInputError("a missing device's snapshot must have null fields")
            return cls(path, kind)
        mode = data["mode"]
        if not isinstance(mode, str) or not _MODE.fullmatch(mode):
            raise MetadataInputError(f"snapshot mode {mode!r} is not four octal digits")
        numbers = {name: data[name] for name in ("major", "minor", "uid", "gid")}
        for name, value in numbers.items():
            top = MAX_DEVNUM if name in ("major", "minor") else MAX_ID
            # bool is an int subclass; true/false in JSON is malformed, not 1/0.
            if type(value) is not int or not 0 <= value <= top:
                raise MetadataInputError(f"snapshot {name} {value!r} is not an integer 0..{top}")
        return cls(path, kind, mode=int(mode, 8), **numbers)


def snapshot(device: str = "/dev/kvm") -> Snapshot:
    """lstat (never follows a symlink) the device; ENOENT/ENOTDIR record it as missing."""
    if not device.startswith("/"):
        raise MetadataInputError(f"device path {device!r} is not absolute")
    try:
        st = os.lstat(device)
    except (FileNotFoundError, NotADirectoryError):
        return Snapshot(device, MISSING)
    except OSError as exc:
        raise MetadataInputError(f"cannot lstat {device}: {exc.strerror}") from exc
    kind = next((name for test, name in _STAT_KINDS if test(st.st_mode)), "other")
    rdev = st.st_rdev
    mode = stat.S_IMODE(st.st_mode)
    return Snapshot(device, kind, os.major(rdev), os.minor(rdev), mode, st.st_uid, st.st_gid)


def load_snapshot(path: str | Path, label: str = "snapshot") -> Snapshot:
    """A snapshot file, read strictly: a regular file of at most SNAPSHOT_MAX_BYTES, UTF-8."""
    try:
        raw = strict_json.read_bytes(
            Path(path), label=f"cannot read {label}", max_bytes=SNAPSHOT_MAX_BYTES
        )
        text = strict_json.decode(raw, label=f"cannot read {label} {path}")
    except strict_json.JsonInputError as exc:
        raise MetadataInputError(str(exc)) from None
    return parse_snapshot_text(text, f"{label} {path}")


def parse_snapshot_text(text: str, label: str = "snapshot") -> Snapshot:
    try:
        data = strict_json.parse(text, label=label)  # deep nesting and NaN refused, one line
    except strict_json.JsonInputError as exc:
        raise MetadataInputError(str(exc)) from None  # "<label>: not JSON: ..." and the like
    try:
        return Snapshot.from_json(data)
    except MetadataInputError as exc:
        raise MetadataInputError(f"{label}: {exc}") from exc


def dump_snapshot(snap: Snapshot) -> str:
    return json.dumps(snap.to_json(), indent=2, sort_keys=True) + "\n"


def parse_group_lookup(text: str, group: str = "kvm") -> int:
    """The gid of `group` from getent-style lines (`kvm:x:993:` or a whole /etc/group)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise MetadataInputError(f"group lookup is empty: the node reported no {group} group")
    entries: list[list[str]] = []
    for number, line in enumerate(lines, 1):
        fields = line.split(":")
        # The line itself is never echoed: a file given by mistake (/etc/shadow) must not print.
        if len(fields) != 4 or not _GROUP_NAME.fullmatch(fields[0]):
            raise MetadataInputError(
                f"group lookup line {number} is malformed: want NAME:x:GID:MEMBERS (getent group)"
            )
        if not _DECIMAL.fullmatch(fields[2]):
            raise MetadataInputError(f"group lookup line {number} has no decimal gid")
        entries.append(fields)
    found = [fields for fields in entries if fields[0] == group]
    if len(found) != 1:
        raise MetadataInputError(f"group lookup has {len(found)} {group!r} entries, want 1")
    return checked_node_gid(found[0][2])


def read_group_lookup(path: str | Path, group: str = "kvm") -> int:
    """parse_group_lookup of a file; an unreadable file is a failed lookup."""
    try:
        raw = strict_json.read_bytes(Path(path), label="group lookup", max_bytes=SNAPSHOT_MAX_BYTES)
        text = strict_json.decode(raw, label=f"group lookup {path}")
    except strict_json.JsonInputError as exc:
        raise MetadataInputError(f"{exc} (could not be read)") from None
    return parse_group_lookup(text, group)


def checked_node_gid(value: str | int) -> int:
    """A node kvm gid as given: decimal, not root's group, a real id."""
    text = str(value)
    if not _DECIMAL.fullmatch(text) or not 0 < int(text) <= MAX_ID:
        # gid 0 would let "startup" hand the host's device to the root group: never a kvm group.
        raise MetadataInputError(f"node kvm gid {text!r} is not an integer 1..{MAX_ID}")
    return int(text)


@dataclass(frozen=True)
class Violation:
    """One broken rule: the field, what happened to it, and the rule that forbids it."""

    field: str
    detail: str
    rule: str


@dataclass(frozen=True)
class Context:
    phase: Phase
    reference: str  # which snapshot `ref` is: "original" or "validated"
    rule: str  # what an unexpected change breaks in this phase
    node_kvm_gid: int | None = None


Rule = Callable[[Snapshot, Snapshot, Context], list[Violation]]


def _changed(ref: Snapshot, cur: Snapshot, name: str, rule: str) -> list[Violation]:
    if not (ref.exists and cur.exists) or getattr(ref, name) == getattr(cur, name):
        return []
    return [Violation(name, f"{name} changed {ref.shown(name)} -> {cur.shown(name)}", rule)]


def rule_present(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    """The device exists now, and existed in the reference snapshot."""
    if not cur.exists:
        was = (
            f"in the {ctx.reference} snapshot and now"
            if not ref.exists
            else f"(was {ref.describe()})"
        )
        return [Violation("type", f"device {cur.path} is missing {was}", DEVICE_RULE)]
    if not ref.exists:
        detail = f"device {ref.path} is missing in the {ctx.reference} snapshot"
        return [Violation("type", detail, DEVICE_RULE)]
    return []


def rule_character(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    """Both existing snapshots are character devices (missing ones are rule_present's)."""
    if not (ref.exists and cur.exists) or ref.kind == cur.kind == CHAR:
        return []
    if ref.kind != cur.kind:
        return [Violation("type", f"type changed {ref.kind} -> {cur.kind}", DEVICE_RULE)]
    return [Violation("type", f"type is {cur.kind} in both snapshots, not {CHAR}", DEVICE_RULE)]


def rule_device_numbers(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    return _changed(ref, cur, "major", ctx.rule) + _changed(ref, cur, "minor", ctx.rule)


def rule_owner(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    return _changed(ref, cur, "uid", ctx.rule)


def rule_mode(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    return _changed(ref, cur, "mode", ctx.rule)


def rule_startup_gid(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    """Startup may move the gid to the node's kvm group, and nowhere else."""
    if ctx.node_kvm_gid is None:
        rule = f"{STARTUP_RULE}, and this node has none (no udev): the gid must stay unchanged"
        return _changed(ref, cur, "gid", rule)
    if cur.gid == ctx.node_kvm_gid:
        return []
    return _changed(ref, cur, "gid", f"{STARTUP_RULE} ({ctx.node_kvm_gid})")


def rule_exact_gid(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    return _changed(ref, cur, "gid", ctx.rule)


def final_reference(original: Snapshot, validated: Snapshot | None) -> tuple[Snapshot, str]:
    """What cleanup is compared with: the validated snapshot, else the original one."""
    return (original, "original") if validated is None else (validated, "validated")


def validated_mismatch(original: Snapshot, validated: Snapshot) -> str:
    """Why `validated` cannot be an accepted startup transition of `original` ("" if it can)."""
    if validated.path != original.path:
        return f"validated snapshot is of {validated.path}, the original of {original.path}"
    ctx = Context("startup", "original", STARTUP_RULE)
    rules = (rule_present, rule_character, rule_device_numbers, rule_owner, rule_mode)
    found = [v for rule in rules for v in rule(original, validated, ctx)]
    return f"validated snapshot cannot follow the original: {found[0].detail}" if found else ""


@dataclass(frozen=True)
class Verdict:
    """The outcome of one phase; `message` is the one line the CLI prints."""

    phase: Phase
    status: Status
    message: str
    reference: str = ""
    violations: tuple[Violation, ...] = ()

    @property
    def exit_code(self) -> int:
        return {"accepted": 0, "rejected": 1, "error": 2}[self.status]

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "status": self.status,
            "message": self.message,
            "reference": self.reference,
            "violations": [v.__dict__ for v in self.violations],
        }


def error_verdict(phase: Phase, problem: str) -> Verdict:
    return Verdict(phase, "error", f"error: {problem}")


def _judge(ref: Snapshot, cur: Snapshot, ctx: Context, rules: Sequence[Rule]) -> Verdict:
    if ref.path != cur.path:
        return error_verdict(
            ctx.phase, f"snapshots are of different paths: {ref.path} and {cur.path}"
        )
    found = tuple(v for rule in rules for v in rule(ref, cur, ctx))
    if found:
        first = found[0]
        message = f"rejected: {first.detail} at {ctx.phase}; rule: {first.rule}"
        if len(found) > 1:
            message += f"; also: {', '.join(v.detail for v in found[1:])}"
        return Verdict(ctx.phase, "rejected", message, ctx.reference, found)
    if ref.gid != cur.gid:
        message = (
            f"accepted: gid changed {ref.gid} -> {cur.gid} at startup, to the node's kvm group; "
            f"everything else unchanged ({cur.describe()})"
        )
    else:
        incomplete = INCOMPLETE if ctx.phase == "final" and ctx.reference == "original" else ""
        message = (
            f"accepted: identical to the {ctx.reference} snapshot at {ctx.phase}{incomplete} "
            f"({cur.describe()})"
        )
    return Verdict(ctx.phase, "accepted", message, ctx.reference)


def check_startup(original: Snapshot, current: Snapshot, node_kvm_gid: int | None) -> Verdict:
    """Phase one; node_kvm_gid None means the node has no udev: expect unchanged."""
    ctx = Context("startup", "original", STARTUP_RULE, node_kvm_gid)
    rules = (rule_present, rule_character, rule_device_numbers, rule_owner, rule_mode)
    return _judge(original, current, ctx, (*rules, rule_startup_gid))


def check_final(original: Snapshot, validated: Snapshot | None, current: Snapshot) -> Verdict:
    """Phase two: exactly the validated snapshot, or the original if startup did not complete."""
    if validated is not None and (why := validated_mismatch(original, validated)):
        return error_verdict("final", why)
    ref, name = final_reference(original, validated)
    rule = FINAL_RULE.format(ref=name) + (INCOMPLETE if name == "original" else "")
    ctx = Context("final", name, rule)
    rules = (rule_present, rule_character, rule_device_numbers, rule_owner, rule_mode)
    return _judge(ref, current, ctx, (*rules, rule_exact_gid))
