"""Which CDI spec is the plugin's: the one declaring the allocated device. Seen in CI: the
device plugin's `hyperlight.json` (kind hyperlight.dev/hypervisor, device kvm) left on a node
the DRA driver then ran on, next to the claim's spec of the same kind."""

from __future__ import annotations

import json

import pytest

from hvconform.contract.base import discover_spec, specs_declaring

KIND = "hyperlight.dev/hypervisor"


class _Dir:
    """A node's CDI dir as the Node contract reads it (list_files/read_file), with sentinels."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.sentinels = files, {"zz-sentinel.json": b"{}"}

    def list_files(self, area: str) -> list[str]:
        assert area == "cdi"
        return sorted(self.files)

    def read_file(self, area: str, name: str) -> bytes | None:
        return self.files.get(name)


def _spec(*devices: str, kind: str = KIND) -> bytes:
    return json.dumps({"cdiVersion": "0.6.0", "kind": kind,
                       "devices": [{"name": d} for d in devices]}).encode()  # fmt: skip


def test_the_claims_spec_is_told_from_a_device_plugins_spec_of_the_same_kind() -> None:
    node = _Dir({
        "hyperlight.json": _spec("kvm"),
        "hyperlight-claim-1.json": _spec("kvm-1"),
        "hyperlight-claim-2.json": _spec("kvm-2"),
        "zz-sentinel.json": b"{}",
        "broken.json": b"{not json",
    })  # fmt: skip
    assert discover_spec(node, [f"{KIND}=kvm-1"]) == "hyperlight-claim-1.json"
    assert discover_spec(node, [f"{KIND}=kvm"]) == "hyperlight.json"
    assert specs_declaring(node, [f"{KIND}=kvm-2", f"{KIND}=kvm"]) == {
        "hyperlight-claim-2.json", "hyperlight.json"}  # fmt: skip
    assert specs_declaring(node, ["other.dev/x=kvm-1"]) == set()  # the kind counts too


def test_without_an_exact_match_the_one_spec_of_the_kind_is_taken_or_refused() -> None:
    one = _Dir({"hyperlight.json": _spec("kvm")})
    assert discover_spec(one, [f"{KIND}=renamed"]) == "hyperlight.json"
    two = _Dir({"a.json": _spec("x"), "b.json": _spec("y")})
    with pytest.raises(AssertionError, match="want exactly one spec"):
        discover_spec(two, [f"{KIND}=z"])
    assert discover_spec(two, []) == ""
