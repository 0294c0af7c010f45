"""Resolve a qualified CDI device name the way a container runtime does (standard library only).

Mirrors the CDI cache rules: spec directories in priority order (later wins), top-level spec
files only, malformed files skipped with their error recorded, and a device defined twice in one
directory dropped as a conflict. Divergence: YAML specs are recorded as errors and skipped, since
the standard library has no YAML parser.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SPEC_DIRS: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
KNOWN_VERSIONS: tuple[str, ...] = (
    *("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"),
    *("1.0.0", "1.1.0"),
)

_VENDOR_CLASS = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_DEVICE = r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?"
_KIND_RE = re.compile(rf"({_VENDOR_CLASS})/({_VENDOR_CLASS})")
_DEVICE_RE = re.compile(_DEVICE)
_QUALIFIED_RE = re.compile(rf"({_VENDOR_CLASS})/({_VENDOR_CLASS})=({_DEVICE})")

_SPEC_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_DEVICE_KEYS = {"name", "annotations", "containerEdits"}
_EDIT_KEYS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"}
_NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}


class UnresolvableCDIDevice(LookupError):
    """No usable spec defines the requested device(s); same text a runtime reports."""

    def __init__(self, names: Sequence[str], errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(f"unresolvable CDI devices {', '.join(names)}")
        self.names = list(names)
        self.errors = dict(errors or {})


class SpecError(ValueError):
    """A spec file is invalid; it is skipped as a whole."""


@dataclass(frozen=True)
class DeviceNode:
    """One containerEdits.deviceNodes entry."""

    path: str
    host_path: str | None = None
    type: str = ""
    major: int | None = None
    minor: int | None = None
    permissions: str = ""
    uid: int | None = None
    gid: int | None = None
    file_mode: int | None = None


@dataclass(frozen=True)
class ResolvedDevice:
    """A device with the spec-level and device-level edits merged, and where it came from."""

    name: str
    device_nodes: tuple[DeviceNode, ...]
    env: dict[str, str]
    spec_file: str
    priority: int = field(default=0, compare=False)

    @property
    def node_paths(self) -> list[str]:
        """Container paths of the device nodes."""
        return [node.path for node in self.device_nodes]


def parse_qualified_name(name: str) -> tuple[str, str, str]:
    """Split `vendor/class=name`; ValueError names what is wrong."""
    match = _QUALIFIED_RE.fullmatch(name)
    if match is None:
        raise ValueError(
            f"invalid CDI device name {name!r}: want vendor/class=name, e.g. "
            "hyperlight.dev/hypervisor=kvm"
        )
    return match.group(1), match.group(2), match.group(3)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _obj(value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected an object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SpecError(f"{where}: expected a list")
    return value


def _opt_int(node: dict[str, Any], key: str, where: str) -> int | None:
    value = node.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise SpecError(f"{where}.{key}: expected an integer")
    return value


def _edits(value: Any, where: str, needs: list[str]) -> tuple[list[DeviceNode], dict[str, str]]:
    """Validate containerEdits; return its device nodes and env; append version needs."""
    edits = _obj(value, where, _EDIT_KEYS)
    env: dict[str, str] = {}
    for i, item in enumerate(_list(edits.get("env", []), f"{where}.env")):
        if not isinstance(item, str) or "=" not in item:
            raise SpecError(f"{where}.env[{i}]: expected KEY=VALUE")
        key, _, val = item.partition("=")
        env[key] = val
    nodes: list[DeviceNode] = []
    for i, raw in enumerate(_list(edits.get("deviceNodes", []), f"{where}.deviceNodes")):
        at = f"{where}.deviceNodes[{i}]"
        node = _obj(raw, at, _NODE_KEYS)
        path = node.get("path")
        if not isinstance(path, str) or not path:
            raise SpecError(f"{at}.path: required")
        kind = node.get("type", "")
        if kind not in ("", "b", "c", "u", "p"):
            raise SpecError(f"{at}.type: invalid {kind!r}")
        perms = node.get("permissions", "")
        if not isinstance(perms, str) or set(perms) - set("rwm"):
            raise SpecError(f"{at}.permissions: invalid {perms!r} (subset of rwm)")
        host_path = node.get("hostPath")
        if host_path is not None:
            needs.append("0.5.0")
        nodes.append(
            DeviceNode(
                path=path,
                host_path=host_path,
                type=kind,
                major=_opt_int(node, "major", at),
                minor=_opt_int(node, "minor", at),
                permissions=perms,
                uid=_opt_int(node, "uid", at),
                gid=_opt_int(node, "gid", at),
                file_mode=_opt_int(node, "fileMode", at),
            )
        )
    for key in ("mounts", "hooks", "additionalGids"):
        _list(edits.get(key, []), f"{where}.{key}")
    if edits.get("additionalGids"):
        needs.append("0.7.0")
    return nodes, env


def parse_spec(text: str, path: str, priority: int = 0) -> list[ResolvedDevice]:
    """Validate one JSON spec strictly; return its devices or raise SpecError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"invalid JSON: {exc}") from exc
    spec = _obj(data, "spec", _SPEC_KEYS)
    version = spec.get("cdiVersion")
    if version not in KNOWN_VERSIONS:
        raise SpecError(f"cdiVersion: unknown or missing {version!r}")
    kind = spec.get("kind")
    match = _KIND_RE.fullmatch(kind) if isinstance(kind, str) else None
    if match is None:
        raise SpecError(f"kind: invalid {kind!r} (want vendor/class)")
    needs: list[str] = []
    if "." in match.group(2) or "annotations" in spec:
        needs.append("0.6.0")
    top_nodes: list[DeviceNode] = []
    top_env: dict[str, str] = {}
    if "containerEdits" in spec:
        top_nodes, top_env = _edits(spec["containerEdits"], "containerEdits", needs)
    devices = _list(spec.get("devices"), "devices")
    if not devices:
        raise SpecError("devices: at least one device is required")
    out: list[ResolvedDevice] = []
    seen: set[str] = set()
    for i, raw in enumerate(devices):
        dev = _obj(raw, f"devices[{i}]", _DEVICE_KEYS)
        name = dev.get("name")
        if not isinstance(name, str) or _DEVICE_RE.fullmatch(name) is None:
            raise SpecError(f"devices[{i}].name: invalid {name!r}")
        if name in seen:
            raise SpecError(f"devices[{i}].name: duplicate {name!r}")
        seen.add(name)
        if name[0].isdigit():
            needs.append("0.5.0")
        if "annotations" in dev:
            needs.append("0.6.0")
        edits = dev.get("containerEdits", {})
        nodes, env = _edits(edits, f"devices[{i}].containerEdits", needs)
        if not any(edits.values()):
            raise SpecError(f"devices[{i}]: empty device containerEdits")
        merged_env = {**top_env, **env}
        resolved = ResolvedDevice(
            f"{kind}={name}", (*top_nodes, *nodes), merged_env, path, priority
        )
        out.append(resolved)
    required = max(needs, key=_version_tuple, default="0.1.0")
    if _version_tuple(version) < _version_tuple(required):
        raise SpecError(f"cdiVersion {version} is too old for its content (needs {required})")
    return out


def _spec_files(spec_dir: str) -> Iterable[str]:
    try:
        entries = sorted(os.scandir(spec_dir), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []  # a missing directory is ignored, as runtimes do
    return [e.path for e in entries if e.name.endswith((".json", ".yaml")) and e.is_file()]


class CDIRegistry:
    """All devices from the spec dirs, indexed by qualified name; errors kept per file."""

    def __init__(self, spec_dirs: Sequence[str] | None = None) -> None:
        self.spec_dirs = list(DEFAULT_SPEC_DIRS if spec_dirs is None else spec_dirs)
        self.devices: dict[str, ResolvedDevice] = {}
        self.errors: dict[str, list[str]] = {}
        self.refresh()

    def _error(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def refresh(self) -> None:
        """Rescan every spec dir from scratch."""
        self.devices, self.errors = {}, {}
        conflicts: set[str] = set()
        for priority, spec_dir in enumerate(self.spec_dirs):
            for path in _spec_files(spec_dir):
                if path.endswith(".yaml"):
                    self._error(path, "YAML spec skipped: no YAML parser in the standard library")
                    continue
                try:
                    with open(path, encoding="utf-8") as fh:
                        devices = parse_spec(fh.read(), path, priority)
                except (OSError, UnicodeDecodeError, SpecError) as exc:
                    self._error(path, str(exc))
                    continue
                for dev in devices:
                    other = self.devices.get(dev.name)
                    if other is not None and other.priority == priority:
                        # Same directory twice: a conflict; like runtimes, the name is dropped
                        # at the end even if another directory also defines it.
                        message = f"conflicting device {dev.name!r} ({path}, {other.spec_file})"
                        self._error(path, message)
                        self._error(other.spec_file, message)
                        conflicts.add(dev.name)
                        continue
                    self.devices[dev.name] = dev  # a later directory wins
        for name in conflicts:
            self.devices.pop(name, None)

    def resolve_all(self, names: Sequence[str]) -> list[ResolvedDevice]:
        """Resolve every name or raise UnresolvableCDIDevice listing those that failed."""
        missing = [name for name in names if name not in self.devices]
        if missing:
            raise UnresolvableCDIDevice(missing, self.errors)
        return [self.devices[name] for name in names]

    def resolve(self, name: str) -> ResolvedDevice:
        """Resolve one qualified name."""
        return self.resolve_all([name])[0]


def resolve(name: str, spec_dirs: Sequence[str] | None = None) -> ResolvedDevice:
    """Scan the spec dirs (default /etc/cdi then /var/run/cdi) and resolve one device."""
    return CDIRegistry(spec_dirs).resolve(name)
