"""Build the third-party fixture plugins (fixtures/plugins/*) on demand, cached by content hash.

The suite judges these rivals unmodified; tests and `nox -s fixture-plugins` build them through
this one function so both agree on flags and cache. A build is skipped when the binary exists and
its stamp records the same hash of every *.go, go.mod and go.sum and the same `go version`.
Concurrent callers (pytest-xdist workers) serialise on a lock file; the binary is replaced by
rename, so a running plugin never sees a half-written file.
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
    except FixtureBuildError as exc:
        print(f"fixture-plugins: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
