"""Tests for hvconform.guest.cdi_resolve (the CDI resolution the runtime emulation uses) and
the guest package's standard-library-only rule."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from hvconform.guest.cdi_resolve import (
    CDIRegistry,
    UnresolvableCDIDevice,
    parse_qualified_name,
    resolve,
)
from tests.conformance.guest_specs import write_spec as _spec

REPO = Path(__file__).resolve().parents[2]
NAME = "hyperlight.dev/hypervisor=kvm"


@pytest.fixture
def two_dirs(tmp_path: Path) -> tuple[Path, Path]:
    low, high = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    low.mkdir()
    high.mkdir()
    return low, high


def test_cdi_later_dir_wins(two_dirs: tuple[Path, Path]) -> None:
    low, high = two_dirs
    _spec(low / "a.json", "/dev/low")
    _spec(high / "a.json", "/dev/high", env=["HYPERLIGHT_DEVICE_PATH=/dev/high"])
    dev = resolve(NAME, [str(low), str(high)])
    assert dev.node_paths == ["/dev/high"] and dev.spec_file == str(high / "a.json")
    assert dev.env == {"HYPERLIGHT_DEVICE_PATH": "/dev/high"}
    assert resolve(NAME, [str(high), str(low)]).node_paths == ["/dev/low"]
    assert resolve(NAME, [str(low / "missing"), str(low)]).node_paths == ["/dev/low"]


def test_cdi_malformed_files_skipped(tmp_path: Path) -> None:
    (tmp_path / "0-broken.json").write_text("{not json")
    _spec(tmp_path / "1-unknown-field.json", "/dev/x", name="other", extra={"bogus": 1})
    too_old = {"cdiVersion": "0.5.0", "annotations": {"note": "needs 0.6.0"}}
    _spec(tmp_path / "2-too-old.json", "/dev/x", name="old", extra=too_old)
    (tmp_path / "3-spec.yaml").write_text("cdiVersion: 0.6.0\n")
    _spec(tmp_path / "4-good.json", "/dev/kvm")
    (tmp_path / "sub").mkdir()
    _spec(tmp_path / "sub" / "nested.json", "/dev/nested", name="nested")  # not recursed
    registry = CDIRegistry([str(tmp_path)])
    assert registry.resolve(NAME).node_paths == ["/dev/kvm"]
    assert set(registry.errors) == {
        str(tmp_path / n)
        for n in ("0-broken.json", "1-unknown-field.json", "2-too-old.json", "3-spec.yaml")
    }
    assert "unknown field(s) bogus" in registry.errors[str(tmp_path / "1-unknown-field.json")][0]
    assert "too old" in registry.errors[str(tmp_path / "2-too-old.json")][0]
    assert "YAML" in registry.errors[str(tmp_path / "3-spec.yaml")][0]
    for name in ("other", "old", "nested"):
        with pytest.raises(UnresolvableCDIDevice):
            registry.resolve(f"hyperlight.dev/hypervisor={name}")


def test_cdi_conflicting_duplicate_dropped(two_dirs: tuple[Path, Path]) -> None:
    low, high = two_dirs
    _spec(high / "a.json", "/dev/a")
    _spec(high / "b.json", "/dev/b")
    _spec(high / "c.json", "/dev/c", name="mshv")
    _spec(low / "a.json", "/dev/low")
    registry = CDIRegistry([str(low), str(high)])
    with pytest.raises(UnresolvableCDIDevice) as info:
        registry.resolve(NAME)
    assert str(info.value) == f"unresolvable CDI devices {NAME}"
    assert "conflicting device" in registry.errors[str(high / "a.json")][0]
    assert "conflicting device" in registry.errors[str(high / "b.json")][0]
    assert registry.resolve("hyperlight.dev/hypervisor=mshv").node_paths == ["/dev/c"]


def test_cdi_unknown_device_exact_message(tmp_path: Path) -> None:
    _spec(tmp_path / "a.json", "/dev/kvm")
    with pytest.raises(UnresolvableCDIDevice) as info:
        resolve("hyperlight.dev/hypervisor=mshv", [str(tmp_path)])
    assert str(info.value) == "unresolvable CDI devices hyperlight.dev/hypervisor=mshv"
    with pytest.raises(UnresolvableCDIDevice, match=r"^unresolvable CDI devices a/b=c, d/e=f$"):
        CDIRegistry([str(tmp_path)]).resolve_all([NAME, "a/b=c", "d/e=f"])


def test_cdi_names_and_merged_edits(tmp_path: Path) -> None:
    assert parse_qualified_name(NAME) == ("hyperlight.dev", "hypervisor", "kvm")
    for bad in ("kvm", "a/b", "1a/b=c", "a/b=c-", "a/b=", "/b=c"):
        with pytest.raises(ValueError, match="invalid CDI device name"):
            parse_qualified_name(bad)
    extra = {"containerEdits": {"env": ["A=1", "B=top"]}}
    _spec(tmp_path / "a.json", "/dev/kvm", env=["B=dev"], extra=extra)
    dev = resolve(NAME, [str(tmp_path)])
    assert dev.env == {"A": "1", "B": "dev"}
    (node,) = dev.device_nodes
    assert (node.path, node.type, node.permissions) == ("/dev/kvm", "c", "rw")


def test_guest_package_imports_only_the_standard_library() -> None:
    """It runs inside minimal containers: stdlib plus its own package, nothing else."""
    for source in (REPO / "conformance" / "guest").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                allowed = top in sys.stdlib_module_names or name.startswith("hvconform.guest")
                assert allowed, f"{source.name} imports {name}"
