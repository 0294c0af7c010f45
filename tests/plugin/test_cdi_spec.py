"""Desired CDI content and the strict CDI validator (hv_device_plugin.cdi_spec)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from hv_device_plugin.cdi import desired_spec, qualified_name, required_version, validate_spec

GOLDEN_KVM = """\
{
  "cdiVersion": "0.5.0",
  "containerEdits": {
    "env": [
      "HYPERLIGHT_HYPERVISOR=kvm",
      "HYPERLIGHT_DEVICE_PATH=/dev/kvm"
    ]
  },
  "devices": [
    {
      "containerEdits": {
        "deviceNodes": [
          {
            "gid": 65534,
            "path": "/dev/kvm",
            "permissions": "rw",
            "type": "c",
            "uid": 65534
          }
        ]
      },
      "name": "kvm"
    }
  ],
  "kind": "hyperlight.dev/hypervisor"
}
"""


def base() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(desired_spec(device_name="kvm", device_path="/dev/kvm"))
    return spec


def problems_of(spec: Any) -> list[str]:
    return validate_spec(json.dumps(spec).encode())


def test_desired_kvm_is_byte_exact_golden() -> None:
    assert desired_spec(device_name="kvm", device_path="/dev/kvm") == GOLDEN_KVM.encode()


def test_desired_is_deterministic_sorted_and_newline_terminated() -> None:
    args: dict[str, Any] = {"device_name": "mshv", "device_path": "/dev/mshv", "uid": 7, "gid": 9}
    first, second = desired_spec(**args), desired_spec(**args)
    assert first == second
    assert first.endswith(b"}\n") and not first.endswith(b"\n\n")
    parsed = json.loads(first)
    assert (json.dumps(parsed, sort_keys=True, indent=2) + "\n").encode() == first
    node = parsed["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert node == {"path": "/dev/mshv", "type": "c", "permissions": "rw", "uid": 7, "gid": 9}
    assert "major" not in node and "minor" not in node
    assert parsed["containerEdits"]["env"] == [
        "HYPERLIGHT_HYPERVISOR=mshv",
        "HYPERLIGHT_DEVICE_PATH=/dev/mshv",
    ]
    assert validate_spec(first) == []


def test_qualified_name() -> None:
    assert qualified_name("hyperlight.dev/hypervisor", "kvm") == "hyperlight.dev/hypervisor=kvm"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_name": "xen"}, "device_name"),
        ({"device_path": "dev/kvm"}, "absolute"),
        ({"uid": -1}, "uid"),
        ({"gid": 2**32}, "gid"),
        ({"cdi_version": "0.9.0"}, "not a known CDI version"),
        ({"cdi_version": "v0.5.0"}, "not a known CDI version"),
        ({"cdi_version": "0.2.0"}, "older than 0.3.0"),
        ({"kind_name": "hyperlight.dev/hyper.visor"}, "older than 0.6.0"),
        ({"kind_name": "hyperlight"}, "not vendor/class"),
        ({"kind_name": "1vendor/class"}, "invalid vendor"),
    ],
)
def test_desired_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"device_name": "kvm", "device_path": "/dev/kvm", **kwargs}
    with pytest.raises(ValueError, match=message):
        desired_spec(**args)


@pytest.mark.parametrize("version", ["0.3.0", "0.4.0", "0.5.0", "0.8.0", "1.0.0", "1.1.0"])
def test_desired_accepts_versions_the_content_allows(version: str) -> None:
    data = desired_spec(device_name="kvm", device_path="/dev/kvm", cdi_version=version)
    assert json.loads(data)["cdiVersion"] == version


def test_dot_in_class_works_from_0_6_0() -> None:
    data = desired_spec(
        kind_name="hyperlight.dev/hyper.visor",
        device_name="kvm",
        device_path="/dev/kvm",
        cdi_version="0.6.0",
    )
    assert validate_spec(data) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not parseable as JSON"),
        (b"cdiVersion: 0.5.0\nkind: a/b\n", "YAML is not accepted"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"cdiVersion": NaN}', "not parseable"),
        (b'{"kind": "a/b", "kind": "a/c"}', "duplicate key"),
        (b"[]", "top level must be an object"),
        (b"", "not parseable"),
    ],
)
def test_unparseable(data: bytes, message: str) -> None:
    problems = validate_spec(data)
    assert len(problems) == 1 and message in problems[0], problems


def _set(path: str, value: Any) -> Any:
    """A mutation of base(): set (or with value DELETE, remove) the dotted/indexed path."""

    def mutate(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        key: Any = int(last) if last.isdigit() else last
        if value is DELETE:
            del node[key]
        else:
            node[key] = value

    return mutate


DELETE = object()
NODE = "devices.0.containerEdits.deviceNodes.0"


@pytest.mark.parametrize(
    ("mutations", "message"),
    [
        ([_set("cdiVersion", DELETE)], "cdiVersion: required field missing"),
        ([_set("kind", DELETE)], "kind: required field missing"),
        ([_set("devices", DELETE)], "devices: required field missing"),
        ([_set("devices.0.name", DELETE)], "devices[0].name: required field missing"),
        ([_set(f"{NODE}.path", DELETE)], "deviceNodes[0].path: required field missing"),
        ([_set("extra", 1)], "spec: unknown field 'extra'"),
        ([_set("devices.0.extra", 1)], "devices[0]: unknown field 'extra'"),
        ([_set("containerEdits.extra", [])], "containerEdits: unknown field 'extra'"),
        ([_set(f"{NODE}.hostpath", "/x")], "deviceNodes[0]: unknown field 'hostpath'"),
        ([_set("cdiVersion", 5)], "must be a string"),
        ([_set(f"{NODE}.uid", -1)], "uid: must be an integer"),
        ([_set(f"{NODE}.gid", 2**32)], "gid: must be an integer"),
        ([_set(f"{NODE}.uid", True)], "uid: must be an integer"),
        ([_set(f"{NODE}.major", "10")], "major: must be an integer"),
        ([_set("containerEdits.env", "A=B")], "env: must be a list"),
        ([_set("devices", {})], "devices: must be a list"),
        ([_set("kind", "hypervisor")], "not vendor/class"),
        ([_set("kind", "9vendor.dev/class")], "invalid vendor"),
        ([_set("kind", "vendor-/class")], "invalid vendor"),
        ([_set("kind", "vendor/cl/ass")], "invalid class"),
        ([_set("kind", "vendor/cl ass")], "invalid class"),
        ([_set("devices", [])], "at least one device"),
        ([_set("devices.0.name", "kvm!")], "invalid device name"),
        ([_set("devices.0.name", "kvm-")], "invalid device name"),
        ([_set("devices.0.containerEdits", {})], "empty container edits"),
        ([_set(f"{NODE}.type", "x")], "invalid type"),
        ([_set(f"{NODE}.permissions", "rwx")], "not a subset of 'rwm'"),
        ([_set(f"{NODE}.path", "")], "empty device path"),
        ([_set("containerEdits.env", ["NOEQUALS"])], "is not KEY=VALUE"),
        ([_set("containerEdits.env", ["=value"])], "is not KEY=VALUE"),
        (
            [_set("containerEdits.hooks", [{"hookName": "preboot", "path": "/x"}])],
            "invalid hook name",
        ),
        (
            [_set("containerEdits.mounts", [{"hostPath": "", "containerPath": "/x"}])],
            "mounts[0].hostPath: empty path",
        ),
        ([_set("cdiVersion", "0.9.0")], "unknown version"),
        ([_set("cdiVersion", "v0.5.0")], "unknown version"),
        ([_set("annotations", {"bad key!": "v"}), _set("cdiVersion", "0.6.0")], "annotation key"),
        ([_set("annotations", {"k": 1}), _set("cdiVersion", "0.6.0")], "must be a string"),
    ],
)
def test_rule_violations(mutations: list[Any], message: str) -> None:
    spec = base()
    for mutate in mutations:
        mutate(spec)
    problems = problems_of(spec)
    assert any(message in p for p in problems), problems


def test_duplicate_device_names() -> None:
    spec = base()
    spec["devices"].append(copy.deepcopy(spec["devices"][0]))
    assert any("duplicate device name 'kvm'" in p for p in problems_of(spec))


# (mutation, version that is too old, lowest version that works)
VERSION_RULES = [
    (_set("cdiVersion", "0.3.0"), "0.2.0", "0.3.0"),
    (_set("containerEdits.mounts", [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]),
     "0.3.0", "0.4.0"),
    (_set(f"{NODE}.hostPath", "/dev/kvm"), "0.4.0", "0.5.0"),
    (_set("devices.0.name", "0kvm"), "0.4.0", "0.5.0"),
    (_set("annotations", {"example.com/a": "b"}), "0.5.0", "0.6.0"),
    (_set("devices.0.annotations", {"a": "b"}), "0.5.0", "0.6.0"),
    (_set("kind", "hyperlight.dev/hyper.visor"), "0.5.0", "0.6.0"),
    (_set("containerEdits.additionalGids", [5]), "0.6.0", "0.7.0"),
    (_set("devices.0.containerEdits.additionalGids", [5]), "0.6.0", "0.7.0"),
    (_set("containerEdits.intelRdt", {"closID": "c"}), "0.6.0", "0.7.0"),
    (_set("containerEdits.netDevices", [{"hostInterfaceName": "eth0", "name": "n0"}]),
     "1.0.0", "1.1.0"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "too_old", "lowest"), VERSION_RULES)
def test_version_rules(mutate: Any, too_old: str, lowest: str) -> None:
    spec = base()
    mutate(spec)
    assert required_version(spec)[0] == lowest
    spec["cdiVersion"] = too_old
    problems = problems_of(spec)
    assert any(f"older than {lowest}" in p for p in problems), problems
    spec["cdiVersion"] = lowest
    assert problems_of(spec) == []


def test_everything_at_1_1_0_is_valid() -> None:
    spec = base()
    spec["cdiVersion"] = "1.1.0"
    spec["annotations"] = {"example.com/owner": "hv"}
    edits = spec["devices"][0]["containerEdits"]
    edits["deviceNodes"][0].update(hostPath="/dev/kvm", major=10, minor=232, fileMode=0o666)
    edits["mounts"] = [{"hostPath": "/a", "containerPath": "/b", "options": ["ro"], "type": "b"}]
    edits["hooks"] = [{"hookName": "createContainer", "path": "/bin/true", "timeout": 5}]
    edits["additionalGids"] = [36]
    edits["intelRdt"] = {"closID": "g", "schemata": ["L3:0=f"], "enableMonitoring": True}
    edits["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net1"}]
    assert problems_of(spec) == []
    assert required_version(spec) == ("1.1.0", "intelRdt.schemata/enableMonitoring")
