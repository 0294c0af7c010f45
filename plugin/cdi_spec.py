"""CDI spec content: the plugin's desired bytes and a strict validator for CDI JSON files."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from hv_device_plugin.api.names import CDI_KIND

DEFAULT_KIND = CDI_KIND
# Configurable. The content itself needs only 0.3.0; podman 4.3 (Debian 12) resolves 0.5.0
# specs but not 0.6.0 ones.
DEFAULT_CDI_VERSION = "0.5.0"
HYPERVISORS = ("kvm", "mshv")

# Ordered oldest first; ordering is what version comparison uses.
KNOWN_VERSIONS = (
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
)  # fmt: skip
# Current CDI parsers start their minimum-version computation at 0.3.0, so they reject a file
# declaring 0.1.0 or 0.2.0 although those versions are "known" (podman 4.3's older one does not).
EARLIEST_USABLE = "0.3.0"

_VENDOR_RE = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_CLASS_RE = _VENDOR_RE
_DEVICE_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_ANN_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
)
_HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
_NODE_TYPES = ("", "b", "c", "u", "p")
_ANNOTATIONS_MAX_BYTES = 256 * 1024
UINT32_MAX = 2**32 - 1
_INT64 = (-(2**63), 2**63 - 1)

Problems = list[str]
_Check = Callable[[Any, str, Problems], None]


def qualified_name(kind_name: str, device_name: str) -> str:
    """`vendor/class=name`, the name a runtime resolves."""
    return f"{kind_name}={device_name}"


def _version_key(version: str) -> int:
    return KNOWN_VERSIONS.index(version)


def desired_spec(
    *,
    kind_name: str = DEFAULT_KIND,
    device_name: str,
    device_path: str,
    uid: int = 65534,
    gid: int = 65534,
    cdi_version: str = DEFAULT_CDI_VERSION,
    cdi_name: str = "",
) -> bytes:
    """The exact bytes of the plugin's CDI spec; raises ValueError on unusable arguments.

    `cdi_name` names the CDI device (default: the hypervisor's name): the DRA mode writes one
    spec per claim, and CDI device names of one kind must differ across spec files."""
    if device_name not in HYPERVISORS:
        raise ValueError(f"device_name must be one of {HYPERVISORS}, got {device_name!r}")
    if cdi_name and not _DEVICE_RE.fullmatch(cdi_name):
        raise ValueError(f"cdi_name must be a CDI device name, got {cdi_name[:80]!r}")
    if not device_path.startswith("/") or any(c in device_path for c in "\0\n"):
        raise ValueError(f"device_path must be an absolute path, got {device_path!r}")
    for label, ident in (("uid", uid), ("gid", gid)):
        if isinstance(ident, bool) or not 0 <= ident <= UINT32_MAX:
            raise ValueError(f"{label} must be in 0..{UINT32_MAX}, got {ident!r}")
    if cdi_version not in KNOWN_VERSIONS:
        raise ValueError(
            f"cdi_version {cdi_version!r} is not a known CDI version ({', '.join(KNOWN_VERSIONS)})"
        )
    spec = {
        "cdiVersion": cdi_version,
        "kind": kind_name,
        "devices": [
            {
                "name": cdi_name or device_name,
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": device_path,
                            "type": "c",
                            "permissions": "rw",
                            "uid": uid,
                            "gid": gid,
                        }
                    ]
                },
            }
        ],
        "containerEdits": {
            "env": [f"HYPERLIGHT_HYPERVISOR={device_name}", f"HYPERLIGHT_DEVICE_PATH={device_path}"]
        },
    }
    needed, why = required_version(spec)
    if _version_key(cdi_version) < _version_key(needed):
        raise ValueError(f"cdi_version {cdi_version} is older than {needed}, required by {why}")
    data = (json.dumps(spec, sort_keys=True, indent=2) + "\n").encode()
    problems = validate_spec(data)
    if problems:
        raise ValueError("desired CDI spec is invalid: " + "; ".join(problems))
    return data


def required_version(spec: dict[str, Any]) -> tuple[str, str]:
    """Lowest version the content of a parsed spec needs, and the feature that needs it."""
    best, why = EARLIEST_USABLE, "the earliest version current parsers accept"

    def need(version: str, feature: str) -> None:
        nonlocal best, why
        if _version_key(version) > _version_key(best):
            best, why = version, feature

    edits_list = [spec.get("containerEdits")]
    for dev in _list(spec.get("devices")):
        if not isinstance(dev, dict):
            continue
        edits_list.append(dev.get("containerEdits"))
        name = dev.get("name")
        if isinstance(name, str) and name and not (name[0].isascii() and name[0].isalpha()):
            need("0.5.0", f"device name {name!r} not starting with a letter")
        if dev.get("annotations"):
            need("0.6.0", "device annotations")
    if spec.get("annotations"):
        need("0.6.0", "spec annotations")
    kind = spec.get("kind")
    if isinstance(kind, str) and "/" in kind and "." in kind.split("/", 1)[1]:
        need("0.6.0", "a dot in the kind's class")
    for edits in edits_list:
        if not isinstance(edits, dict):
            continue
        if any(isinstance(m, dict) and m.get("type") for m in _list(edits.get("mounts"))):
            need("0.4.0", "mounts[].type")
        if any(isinstance(n, dict) and n.get("hostPath") for n in _list(edits.get("deviceNodes"))):
            need("0.5.0", "deviceNodes[].hostPath")
        rdt = edits.get("intelRdt")
        if rdt is not None:
            need("0.7.0", "intelRdt")
        if edits.get("additionalGids"):
            need("0.7.0", "additionalGids")
        if isinstance(rdt, dict) and ("schemata" in rdt or rdt.get("enableMonitoring")):
            need("1.1.0", "intelRdt.schemata/enableMonitoring")
        if edits.get("netDevices"):
            need("1.1.0", "netDevices")
    return best, why


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def validate_spec(data: bytes) -> Problems:
    """CDI problems of a spec file's bytes; [] when a strict CDI parser would accept it.

    Only JSON is understood: YAML (which CDI also allows) is reported as malformed here.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [f"not UTF-8: {exc.reason} at byte {exc.start}"]
    try:
        spec = json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant
        )
    except ValueError as exc:
        return [f"not parseable as JSON (YAML is not accepted here): {exc}"]
    except RecursionError:  # arrays or objects nested thousands deep: no CDI spec is
        return ["not parseable as JSON: nested too deeply"]
    problems: Problems = []
    if not isinstance(spec, dict):
        return [f"top level must be an object, got {_type_name(spec)}"]
    _check_object(spec, "", _SPEC_FIELDS, {"cdiVersion", "kind", "devices"}, problems)
    if problems:
        return problems
    _check_semantics(spec, problems)
    return problems


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_object(
    obj: Any, where: str, fields: dict[str, _Check], required: set[str], problems: Problems
) -> None:
    if not isinstance(obj, dict):
        problems.append(f"{where or 'spec'}: must be an object, got {_type_name(obj)}")
        return
    for key in sorted(required - obj.keys()):
        problems.append(f"{_join(where, key)}: required field missing")
    for key, value in obj.items():
        check = fields.get(key)
        if check is None:
            problems.append(f"{where or 'spec'}: unknown field {key!r}")
        else:
            check(value, _join(where, key), problems)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _str(value: Any, where: str, problems: Problems) -> None:
    if not isinstance(value, str):
        problems.append(f"{where}: must be a string, got {_type_name(value)}")


def _bool(value: Any, where: str, problems: Problems) -> None:
    if not isinstance(value, bool):
        problems.append(f"{where}: must be a boolean, got {_type_name(value)}")


def _int_range(lo: int, hi: int) -> _Check:
    def check(value: Any, where: str, problems: Problems) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            problems.append(f"{where}: must be an integer in {lo}..{hi}, got {value!r}")

    return check


def _list_of(item: _Check) -> _Check:
    def check(value: Any, where: str, problems: Problems) -> None:
        if not isinstance(value, list):
            problems.append(f"{where}: must be a list, got {_type_name(value)}")
            return
        for i, element in enumerate(value):
            item(element, f"{where}[{i}]", problems)

    return check


def _obj(fields: dict[str, _Check], required: set[str] | None = None) -> _Check:
    def check(value: Any, where: str, problems: Problems) -> None:
        _check_object(value, where, fields, required or set(), problems)

    return check


def _annotations(value: Any, where: str, problems: Problems) -> None:
    if not isinstance(value, dict):
        problems.append(f"{where}: must be an object, got {_type_name(value)}")
        return
    size = 0
    for key, val in value.items():
        if not isinstance(val, str):
            problems.append(f"{where}[{key!r}]: value must be a string, got {_type_name(val)}")
            continue
        size += len(key) + len(val)
        prefix, _, name = key.rpartition("/")
        if not (len(name) <= 63 and _ANN_NAME_RE.fullmatch(name)) or (
            "/" in key and not (len(prefix) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(prefix))
        ):
            problems.append(f"{where}: invalid annotation key {key!r}")
    if size > _ANNOTATIONS_MAX_BYTES:
        problems.append(f"{where}: annotations total {size} bytes, limit {_ANNOTATIONS_MAX_BYTES}")


_STRS = _list_of(_str)
_UINT32 = _int_range(0, UINT32_MAX)
_DEVICE_NODE_FIELDS: dict[str, _Check] = {
    "path": _str,
    "hostPath": _str,
    "type": _str,
    "major": _int_range(*_INT64),
    "minor": _int_range(*_INT64),
    "fileMode": _UINT32,
    "permissions": _str,
    "uid": _UINT32,
    "gid": _UINT32,
}
_EDITS_FIELDS: dict[str, _Check] = {
    "env": _STRS,
    "deviceNodes": _list_of(_obj(_DEVICE_NODE_FIELDS, {"path"})),
    "hooks": _list_of(
        _obj(
            {
                "hookName": _str,
                "path": _str,
                "args": _STRS,
                "env": _STRS,
                "timeout": _int_range(*_INT64),
            },
            {"hookName", "path"},
        )
    ),
    "mounts": _list_of(
        _obj(
            {"hostPath": _str, "containerPath": _str, "options": _STRS, "type": _str},
            {"hostPath", "containerPath"},
        )
    ),
    "intelRdt": _obj(
        {
            "closID": _str,
            "l3CacheSchema": _str,
            "memBwSchema": _str,
            "schemata": _STRS,
            "enableCMT": _bool,
            "enableMBM": _bool,
            "enableMonitoring": _bool,
        }
    ),
    "additionalGids": _list_of(_UINT32),
    "netDevices": _list_of(
        _obj({"hostInterfaceName": _str, "name": _str}, {"hostInterfaceName", "name"})
    ),
}
_DEVICE_FIELDS: dict[str, _Check] = {
    "name": _str,
    "annotations": _annotations,
    "containerEdits": _obj(_EDITS_FIELDS),
}
_SPEC_FIELDS: dict[str, _Check] = {
    "cdiVersion": _str,
    "kind": _str,
    "annotations": _annotations,
    "devices": _list_of(_obj(_DEVICE_FIELDS, {"name", "containerEdits"})),
    "containerEdits": _obj(_EDITS_FIELDS),
}


def _check_semantics(spec: dict[str, Any], problems: Problems) -> None:
    """Rules beyond shape, run once the shape is known to be right."""
    version = spec["cdiVersion"]
    if version not in KNOWN_VERSIONS:
        problems.append(f"cdiVersion: unknown version {version!r}")
    else:
        needed, why = required_version(spec)
        if _version_key(version) < _version_key(needed):
            problems.append(f"cdiVersion: {version} is older than {needed}, required by {why}")
    vendor, sep, klass = spec["kind"].partition("/")
    if not sep:
        problems.append(f"kind: {spec['kind']!r} is not vendor/class")
    else:
        if not _VENDOR_RE.fullmatch(vendor):
            problems.append(f"kind: invalid vendor {vendor!r}")
        if not _CLASS_RE.fullmatch(klass):
            problems.append(f"kind: invalid class {klass!r}")
    if not spec["devices"]:
        problems.append("devices: at least one device is required")
    _check_edits(spec.get("containerEdits", {}), "containerEdits", problems)
    seen: set[str] = set()
    for i, dev in enumerate(spec["devices"]):
        where, name = f"devices[{i}]", dev["name"]
        if not _DEVICE_RE.fullmatch(name):
            problems.append(f"{where}.name: invalid device name {name!r}")
        if name in seen:
            problems.append(f"{where}.name: duplicate device name {name!r}")
        seen.add(name)
        edits = dev["containerEdits"]
        if not any(edits.get(k) for k in _EDITS_FIELDS):
            problems.append(f"{where}.containerEdits: empty container edits")
        _check_edits(edits, f"{where}.containerEdits", problems)


def _check_edits(edits: dict[str, Any], where: str, problems: Problems) -> None:
    for i, env in enumerate(edits.get("env", [])):
        if env.find("=") <= 0:
            problems.append(f"{where}.env[{i}]: {env!r} is not KEY=VALUE")
    for i, node in enumerate(edits.get("deviceNodes", [])):
        at = f"{where}.deviceNodes[{i}]"
        if not node["path"]:
            problems.append(f"{at}.path: empty device path")
        if node.get("type", "") not in _NODE_TYPES:
            problems.append(f"{at}.type: invalid type {node['type']!r} (one of '', b, c, u, p)")
        if set(node.get("permissions", "")) - set("rwm"):
            problems.append(f"{at}.permissions: {node['permissions']!r} is not a subset of 'rwm'")
    for i, hook in enumerate(edits.get("hooks", [])):
        at = f"{where}.hooks[{i}]"
        if hook["hookName"] not in _HOOK_NAMES:
            problems.append(f"{at}.hookName: invalid hook name {hook['hookName']!r}")
        if not hook["path"]:
            problems.append(f"{at}.path: empty hook path")
        for j, env in enumerate(hook.get("env", [])):
            if env.find("=") <= 0:
                problems.append(f"{at}.env[{j}]: {env!r} is not KEY=VALUE")
    for i, mount in enumerate(edits.get("mounts", [])):
        for key in ("hostPath", "containerPath"):
            if not mount[key]:
                problems.append(f"{where}.mounts[{i}].{key}: empty path")
    closid = edits.get("intelRdt", {}).get("closID", "")
    if len(closid) >= 4096 or closid in (".", "..") or any(c in closid for c in "/\n"):
        problems.append(f"{where}.intelRdt.closID: {closid!r} is not a valid file name")
