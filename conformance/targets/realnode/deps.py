"""`nox -s node-deps`: the host packages the real node needs, installed idempotently.

containerd with CDI needs 1.7+, and bookworm has 1.6.20. So containerd comes from Debian trixie,
pinned (gobuild/README.md): a sources file for trixie, and preferences that give every trixie
package priority 1 (never chosen on its own) and containerd 990 (chosen). Steps:

1. Write the two apt files when their content differs (nothing else in /etc/apt is touched).
2. `apt-get update`, then `apt-get install -s` (a simulation): if it would remove any package
   or take anything but containerd from trixie, stop and say so: nothing is installed.
3. The install itself, through scripts/device-guard (the host's /dev/kvm and /dev/mshv are put
   back, loudly, if a package's trigger changed them), `--no-install-recommends`.
4. Verify: `containerd --version` says CONTAINERD_VERSION.

Already there (containerd at the version, files unchanged): nothing runs but the check.
`--dry-run` does steps 1-2 in a private apt state directory (the files there, the package lists
there): it prints what the install would do and changes nothing on this machine.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hvconform.contract.preconditions import version_of
from hvconform.targets.realnode import REPO

CONTAINERD_VERSION = "1.7.24"  # trixie's; the first with CDI is 1.7.0
SOURCES = Path("/etc/apt/sources.list.d/hv-node-trixie.sources")
PREFERENCES = Path("/etc/apt/preferences.d/hv-node-trixie")
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SOURCES_TEXT = f"""\
# hv-node (nox -s node-deps): containerd with CDI from trixie; nothing else (see the pin)
Types: deb
URIs: {MIRROR}
Suites: trixie
Components: main
Signed-By: {KEYRING}
"""
PREFERENCES_TEXT = """\
# hv-node (nox -s node-deps): nothing from trixie unless asked for, except containerd
Package: *
Pin: release n=trixie
Pin-Priority: 1

Package: containerd
Pin: release n=trixie
Pin-Priority: 990
"""
GUARD = REPO / "scripts" / "device-guard"
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_INST = re.compile(r"^Inst (\S+) (?:\[(\S+)\] )?\((\S+) ([^)]*)\)")
_REMV = re.compile(r"^Remv (\S+)")


class DepsError(RuntimeError):
    """The install would do something it must not, or did not give the wanted version."""


def installed_version() -> str:
    return version_of(["containerd", "--version"], r"containerd\s+\S+\s+v?(\S+)")["version"]


def have_wanted() -> bool:
    return installed_version().split("~")[0].split("-")[0] == CONTAINERD_VERSION


def write_if_changed(path: Path, text: str) -> bool:
    """True when the file was (re)written."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)
    return True


def plan(simulation: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(package, version, release) of every Inst line; every package a Remv line removes."""
    installs, removals = [], []
    for line in simulation.splitlines():
        if (m := _INST.match(line)) is not None:
            installs.append((m.group(1), m.group(3), m.group(4)))
        elif (m := _REMV.match(line)) is not None:
            removals.append(m.group(1))
    return installs, removals


def _ours(release: str) -> bool:
    """A release of this machine's Debian (12, bookworm: "Debian:12.12/oldstable [amd64]",
    "Debian-Security:12/oldstable-security"); trixie shows as "Debian:13.x/stable"."""
    return re.search(r":12(?:[./\s]|$)|bookworm", release) is not None


def judge(simulation: str) -> list[str]:
    """What is wrong with the simulated install (empty: it may go ahead)."""
    installs, removals = plan(simulation)
    problems = [f"it would remove {', '.join(removals)}"] if removals else []
    others = [f"{p} {v} ({r})" for p, v, r in installs if not _ours(r) and p != "containerd"]
    if others:
        problems.append(f"it would take more than containerd from trixie: {', '.join(others)}")
    versions = [v for p, v, _ in installs if p == "containerd"]
    if versions and not versions[0].startswith(CONTAINERD_VERSION):
        problems.append(f"it would install containerd {versions[0]}, not {CONTAINERD_VERSION}")
    return problems


def _apt(args: Sequence[str], options: Sequence[str] = (), cwd: Path | None = None) -> str:
    """apt-get; `cwd` matters to `download`, which writes the package there."""
    env_args = ["apt-get", "-q", *options, *args]
    res = subprocess.run(
        env_args, capture_output=True, text=True, check=False, env=APT_ENV, cwd=cwd
    )
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:]
        raise DepsError(f"{' '.join(env_args[:3])} {args[0]} failed: {' '.join(tail)}")
    return res.stdout


def private_apt(root: Path) -> list[str]:
    """apt options for a state of its own below root, with the two pin files in it: bookworm's
    sources as this machine has them, plus trixie; lists and caches there too."""
    etc = root / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "preferences.d").mkdir()
    for source in Path("/etc/apt/sources.list.d").glob("*"):
        if source.name != SOURCES.name and source.is_file():
            (etc / "sources.list.d" / source.name).write_bytes(source.read_bytes())
    (etc / "sources.list.d" / SOURCES.name).write_text(SOURCES_TEXT)
    (etc / "preferences.d" / PREFERENCES.name).write_text(PREFERENCES_TEXT)
    lists = root / "lists"
    (lists / "partial").mkdir(parents=True)
    (root / "cache" / "archives" / "partial").mkdir(parents=True)
    sources_list = Path("/etc/apt/sources.list")
    return [
        "-o", f"Dir::Etc::SourceList={sources_list if sources_list.exists() else '/dev/null'}",
        "-o", f"Dir::Etc::SourceParts={etc / 'sources.list.d'}",
        "-o", f"Dir::Etc::PreferencesParts={etc / 'preferences.d'}",
        "-o", f"Dir::State::Lists={lists}",
        "-o", f"Dir::Cache={root / 'cache'}",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip


def simulate(options: Sequence[str] = ()) -> str:
    _apt(["update"], options)
    return _apt(["install", "-s", "--no-install-recommends", "containerd"], options)


def dry_run() -> int:
    with tempfile.TemporaryDirectory(prefix="hv-node-deps-") as tmp:
        simulation = simulate(private_apt(Path(tmp)))
    installs, _ = plan(simulation)
    for package, version, release in installs:
        print(f"node-deps: would install {package} {version} ({release})")
    problems = judge(simulation)
    for problem in problems:
        print(f"node-deps: refused: {problem}", file=sys.stderr)
    print(f"node-deps: installed now: containerd {installed_version()}")
    return 1 if problems else 0


def install() -> int:
    changed = write_if_changed(SOURCES, SOURCES_TEXT) | write_if_changed(
        PREFERENCES, PREFERENCES_TEXT
    )
    if have_wanted() and not changed:
        print(f"node-deps: containerd {installed_version()} already installed")
        return 0
    simulation = simulate()
    problems = judge(simulation)
    if problems:
        raise DepsError("; ".join(problems) + " (nothing installed)")
    argv = [str(GUARD), "--", "apt-get", "install", "-y", "-q", "--no-install-recommends"]
    res = subprocess.run([*argv, "containerd"], check=False, env=APT_ENV)
    if res.returncode != 0:
        raise DepsError(f"apt-get install containerd failed (exit {res.returncode})")
    if not have_wanted():
        raise DepsError(
            f"containerd is {installed_version()} after the install, not {CONTAINERD_VERSION}"
        )
    print(f"node-deps: containerd {installed_version()} installed (pinned from trixie)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node-deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="simulate in a private apt state")
    ns = parser.parse_args(argv)
    try:
        return dry_run() if ns.dry_run else install()
    except DepsError as exc:
        print(f"node-deps: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
