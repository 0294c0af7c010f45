"""Inputs `hvconform profile init` must refuse: each is exit 2 and one line, and writes nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.profile_tool.test_profile_init import GO_KVM, daemonset, hvconform


def _json(obj: Any) -> Callable[[Path], None]:
    return lambda path: path.write_text(json.dumps(obj))


def _no_containers(path: Path) -> None:
    ds = daemonset()
    ds["spec"]["template"]["spec"]["containers"] = []
    path.write_text(json.dumps(ds))


def _host_path(value: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        ds = daemonset()
        ds["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] = value
        path.write_text(json.dumps(ds))

    return write


def _symlink(path: Path) -> None:
    os.symlink(GO_KVM / "deploy" / "daemonset.yaml", path)


def _huge(path: Path) -> None:
    path.write_text("# padding\n" * 120_000)  # past the 1 MiB cap of one manifest file


def _two_daemonsets(path: Path) -> None:
    other = daemonset()
    other["metadata"]["name"] = "other"
    path.write_text(json.dumps(daemonset()) + "\n---\n" + json.dumps(other))


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "not a mapping": (lambda p: p.write_text("- a\n- b\n"), "not a mapping"),
    "huge file": (_huge, "larger than"),
    "no daemonset": (
        _json({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
        "no DaemonSet",
    ),
    "no containers": (_no_containers, "has no containers"),
    "dotdot hostPath": (_host_path("/var/lib/kubelet/../../etc"), "not a normalised absolute"),
    "other device": (_host_path("/dev/sda"), "only /dev/kvm and /dev/mshv"),
    "latest image": (_json(daemonset(image="example.com/p:latest")), "--image"),
    "symlink": (_symlink, "symlink"),
    "two daemonsets": (_two_daemonsets, "--daemonset"),
    "alias bomb": (lambda p: p.write_text("a: &a [1]\nb: *a\n"), "aliases"),
    "not utf-8": (lambda p: p.write_bytes(b"\xff\xfe kind: DaemonSet"), "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line(tmp_path: Path, case: str) -> None:
    make, said = CASES[case]
    make(tmp_path / "in.yaml")
    done = hvconform("profile", "init", "--from-manifest", "in.yaml", "-o", "p.yaml", cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert said in lines[0]
    assert lines[0].startswith("hvconform profile init: ")
    assert not (tmp_path / "p.yaml").exists()


def test_a_directory_that_is_no_chart_is_refused(tmp_path: Path) -> None:
    done = hvconform("profile", "init", "--from-chart", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "no Chart.yaml" in done.stderr


def test_init_needs_exactly_one_source(tmp_path: Path) -> None:
    done = hvconform("profile", "init", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
