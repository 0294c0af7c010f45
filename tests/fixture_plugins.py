"""Build the third-party fixture plugins (fixtures/plugins/*) on demand, cached by content hash.

The suite judges these rivals unmodified; tests and `nox -s fixture-plugins` build them through
this one function so both agree on flags and cache. A build is skipped when the binary exists and
its stamp records the same hash of every *.go, go.mod and go.sum and the same `go version`.
Concurrent callers (pytest-xdist workers) serialise on a lock file; the binary is replaced by
rename, so a running plugin never sees a half-written file.

The public plugin (squat/generic-device-plugin) has no sources here: it is `go install`ed at
its pinned pseudo-version from the Go module proxy into a cache outside the checkout
(~/.cache/hv-device-plugin/fixture-plugins, XDG_CACHE_HOME honoured), its sources in the module
cache (`go env GOMODCACHE`), then copied to the fixture's git-ignored bin/ where its profile
names it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GO_KVM_DIR = REPO / "fixtures" / "plugins" / "go-kvm"
GO_KVM_NAME = "go-kvm"
GO_DEVSPEC_DIR = REPO / "fixtures" / "plugins" / "go-devspec"
GO_DEVSPEC_NAME = "go-devspec"
GENERIC_DIR = REPO / "fixtures" / "plugins" / "generic-device-plugin"
GENERIC_NAME = "generic-device-plugin"
GENERIC_MODULE = "github.com/squat/generic-device-plugin"
# The proxy serves pseudo-versions only (the module has no tags): pinned exactly, never @latest.
GENERIC_VERSION = "v0.0.0-20260515115838-2cc50b05d4d2"


class FixtureBuildError(RuntimeError):
    """The fixture plugin could not be built (no Go toolchain, or the compiler failed)."""


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise FixtureBuildError(
            "building the Go fixture plugins needs the Go toolchain: no `go` on PATH "
            "(install Go >= 1.26, as scripts/bootstrap does)"
        )
    return go


def _source_hash(src: Path, go: str) -> str:
    digest = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False)
    digest.update(version.stdout.encode())
    files = sorted([*src.glob("*.go"), src / "go.mod", src / "go.sum"])
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def _build(src: Path, name: str) -> Path:
    go = _go()
    bindir = src / "bin"
    bindir.mkdir(exist_ok=True)
    binary, stamp = bindir / name, bindir / f".{name}.stamp"
    with (bindir / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        want = _source_hash(src, go)
        if binary.exists() and stamp.exists() and stamp.read_text() == want:
            return binary
        tmp = bindir / f".{name}.new"
        # CGO off: a static binary, no C compiler needed; go.sum is committed, so readonly.
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local"}
        started = time.monotonic()
        proc = subprocess.run(
            [go, "build", "-trimpath", "-o", str(tmp), "."],
            cwd=src,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise FixtureBuildError(f"go build of {src} failed ({proc.returncode}):\n{tail}")
        tmp.replace(binary)
        stamp.write_text(want)
        print(
            f"built {binary} in {time.monotonic() - started:.1f}s "
            f"({binary.stat().st_size / 1e6:.1f} MB)",
            file=sys.stderr,
        )
        return binary


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hv-device-plugin" / "fixture-plugins"


def _install_module(module: str, version: str, name: str) -> Path:
    """`go install module@version` into the cache, skipped when its stamp holds the same
    module, version and `go version`; the binary in the cache."""
    go = _go()
    gobin = _cache_dir() / f"{name}@{version}"
    gobin.mkdir(parents=True, exist_ok=True)
    binary, stamp = gobin / name, gobin / f".{name}.stamp"
    version_out = subprocess.run([go, "version"], capture_output=True, text=True, check=False)
    want = f"{module}@{version}\n{version_out.stdout}"
    with (gobin / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists() and stamp.exists() and stamp.read_text() == want:
            return binary
        tmp = gobin / ".new"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOBIN": str(tmp)}
        env.pop("GOFLAGS", None)  # -mod=... does not apply to module@version installs
        started = time.monotonic()
        proc = subprocess.run(
            [go, "install", "-trimpath", f"{module}@{version}"],
            cwd=gobin,  # outside any module: the pinned module's own go.mod and go.sum rule
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise FixtureBuildError(f"go install {module}@{version} failed:\n{tail}")
        (tmp / name).replace(binary)
        tmp.rmdir()
        stamp.write_text(want)
        print(f"built {binary} in {time.monotonic() - started:.1f}s", file=sys.stderr)
        return binary


def build_generic_device_plugin() -> Path:
    """squat/generic-device-plugin at its pinned version, from the Go module proxy, unmodified:
    installed into the cache, then copied (by rename) to the fixture's bin/ when it differs."""
    built = _install_module(GENERIC_MODULE, GENERIC_VERSION, GENERIC_NAME)
    bindir = GENERIC_DIR / "bin"
    bindir.mkdir(exist_ok=True)
    binary = bindir / GENERIC_NAME
    with (bindir / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists() and binary.read_bytes() == built.read_bytes():
            return binary
        tmp = bindir / f".{GENERIC_NAME}.new"
        shutil.copy2(built, tmp)
        tmp.replace(binary)
        return binary


def build_go_kvm() -> Path:
    """The go-kvm fixture binary, built if missing or stale; idempotent and safe to call often."""
    return _build(GO_KVM_DIR, GO_KVM_NAME)


def build_go_devspec() -> Path:
    """The go-devspec fixture binary (DeviceSpec answers, no CDI, no health), built like go-kvm."""
    return _build(GO_DEVSPEC_DIR, GO_DEVSPEC_NAME)


def main() -> int:
    try:
        print(build_go_kvm())
        print(build_go_devspec())
        print(build_generic_device_plugin())
    except FixtureBuildError as exc:
        print(f"fixture-plugins: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
