"""`nox -s node-deps`: what the containerd install would do, judged before anything is installed.

The dry run asks apt itself (`apt-get install -s`) in a private state directory with the pin
files, against Debian's mirror, and must leave this machine's apt configuration, package lists
and packages as they were. The judge refuses simulations that remove a package, take anything
but containerd from trixie, or pick another containerd version.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvconform.targets.realnode import deps
from tests.setup.support import REPO

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

UPGRADE = """\
Inst containerd [1.6.20~ds1-1+deb12u3] (1.7.24~ds1-6+deb13u1 Debian:13.8/stable [amd64])
Conf containerd (1.7.24~ds1-6+deb13u1 Debian:13.8/stable [amd64])
"""


def apt_state() -> dict[str, object]:
    """What a dry run could leave behind on the host: pin files, trixie package lists, another
    containerd (other apt users on this machine may change everything else meanwhile)."""
    etc = Path("/etc/apt")
    lists = Path("/var/lib/apt/lists")
    return {
        "pins": sorted((str(p), p.read_text()) for p in etc.rglob("hv-node*") if p.is_file()),
        "trixie lists": sorted(p.name for p in lists.glob("*trixie*")),
        "containerd": deps.installed_version(),
    }


def test_dry_run_asks_apt_and_changes_nothing() -> None:
    before = apt_state()
    res = subprocess.run(
        [sys.executable, "-m", "hvconform.targets.realnode.deps", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
    )
    assert apt_state() == before, "the dry run touched the host's apt state"
    assert not deps.SOURCES.exists() or deps.SOURCES.read_text() == deps.SOURCES_TEXT
    lines = res.stdout.splitlines()
    would = [ln for ln in lines if ln.startswith("node-deps: would install")]
    assert res.returncode == 0, res.stdout + res.stderr
    if deps.have_wanted():
        assert would == [], lines  # already there: nothing to install
    else:
        # On Debian 12 with docker.io: containerd alone, upgraded from trixie.
        assert len(would) == 1 and would[0].startswith(
            f"node-deps: would install containerd {deps.CONTAINERD_VERSION}~"
        ), lines
    assert f"node-deps: installed now: containerd {deps.installed_version()}" in lines


def test_the_judge_passes_containerd_alone() -> None:
    assert deps.judge(UPGRADE) == []
    assert deps.plan(UPGRADE) == (
        [("containerd", "1.7.24~ds1-6+deb13u1", "Debian:13.8/stable [amd64]")],
        [],
    )


def test_the_judge_refuses_removals_other_trixie_packages_and_other_versions() -> None:
    removal = "Remv docker.io [20.10.24+dfsg1-1+deb12u1+b6]\n" + UPGRADE
    assert deps.judge(removal) == ["it would remove docker.io"]
    libc = "Inst libc6 [2.36-9+deb12u10] (2.41-12 Debian:13.8/stable [amd64])\n" + UPGRADE
    assert deps.judge(libc) == [
        "it would take more than containerd from trixie: libc6 2.41-12 (Debian:13.8/stable [amd64])"
    ]
    bookworm = "Inst runc [1.1.5+ds1-1] (1.1.5+ds1-1+deb12u1 Debian:12.12/oldstable [amd64])\n"
    security = (
        "Inst libssl3 [3.0.15-1] (3.0.17-1~deb12u2 Debian-Security:12/oldstable-security [amd64])\n"
    )
    assert deps.judge(bookworm + security + UPGRADE) == []
    other = UPGRADE.replace("1.7.24~ds1-6+deb13u1", "2.1.3~ds1-1")
    assert deps.judge(other) == ["it would install containerd 2.1.3~ds1-1, not 1.7.24"]


def test_pin_files_are_written_once(tmp_path: Path) -> None:
    path = tmp_path / "preferences.d" / "hv-node-trixie"
    assert deps.write_if_changed(path, deps.PREFERENCES_TEXT)
    mtime = path.stat().st_mtime_ns
    assert not deps.write_if_changed(path, deps.PREFERENCES_TEXT)
    assert path.stat().st_mtime_ns == mtime and oct(path.stat().st_mode & 0o777) == "0o644"
    assert "Package: containerd\nPin: release n=trixie\nPin-Priority: 990" in path.read_text()
    assert "Package: *\nPin: release n=trixie\nPin-Priority: 1\n" in path.read_text()
    assert deps.write_if_changed(path, deps.PREFERENCES_TEXT + "# changed\n")
