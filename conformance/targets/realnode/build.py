"""`nox -s node-build`: the node's components from published Go modules, cached under CACHE.

- kubelet, kube-apiserver, kube-scheduler, kube-controller-manager: the published
  k8s.io/kubernetes module of KUBERNETES_VERSION, through the build module in gobuild/build (its
  staging modules pinned to the same release; `--pin` rewrites it from the release's go.mod).
- etcd: the published go.etcd.io/etcd/server/v3 module (gobuild/build/etcd).
- crictl: `go install sigs.k8s.io/cri-tools/cmd/crictl@CRICTL_VERSION`.
- cni: ptp, host-local and loopback from github.com/containernetworking/plugins@CNI_VERSION
  into BIN/cni (pod networks of the cluster-mode nodes, `node-up --nodes N`).
- pause: gobuild/pause, a tiny static binary for the locally made sandbox image (see `image`).
- containerd2, runc (not built by default: `node-build -- containerd2 runc`): containerd
  CONTAINERD2_VERSION (containerd and its runc shim, github.com/containerd/containerd/v2) and
  runc RUNC_VERSION (cgo: its nsexec is C; with seccomp, which containerd 2.x's default
  profile for every sandbox needs: libseccomp-dev, from scripts/bootstrap) into
  CONTAINERD2_BIN, the node's `--node-runtime containerd-2.3` (realnode.runtimes).

One package at a time (`go build -p 1`): other work shares this machine. A component is rebuilt
only when its binary is missing or its stamp names another version. Prints each build time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hvconform.targets.realnode import (
    BIN,
    CACHE,
    CNI_PLUGINS,
    CNI_VERSION,
    CONTAINERD2_BIN,
    CONTAINERD2_VERSION,
    CRICTL_VERSION,
    ETCD_VERSION,
    KUBERNETES_VERSION,
    REPO,
    RUNC_VERSION,
    STAGING_VERSION,
)

BUILD_MODULES = REPO / "gobuild"
STAMPS = CACHE / "stamps"
KUBE_COMPONENTS = ("kubelet", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
ALL_COMPONENTS = (*KUBE_COMPONENTS, "etcd", "crictl", "pause", "cni")
RUNTIME_COMPONENTS = ("containerd2", "runc")  # built when asked for: the containerd 2.x node
_STAGING = re.compile(r"^\s+(k8s\.io/[A-Za-z0-9_.-]+) => \./staging/", re.MULTILINE)


@dataclass(frozen=True)
class Built:
    name: str
    version: str
    seconds: float  # 0.0 when it came from the cache
    cached: bool


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOFLAGS="-mod=mod -trimpath", GOTOOLCHAIN="local")
    return env


def _version_ldflags() -> str:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


def render_build_module(release_go_mod: str) -> str:
    """The build module's go.mod: require the release, pin each of its staging modules."""
    staging = sorted(set(_STAGING.findall(release_go_mod)))
    if not staging:
        raise ValueError("the release's go.mod names no ./staging replacements")
    go = re.search(r"^go (\S+)$", release_go_mod, re.MULTILINE)
    lines = [
        "// Build module for hv-node (issue #9): the published k8s.io/kubernetes module of ONE pinned",
        "// release. k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with",
        "// ./staging/... paths that do not exist outside its repository, so this module pins each",
        "// staging module to the published tag of the same release. Written by",
        "// `python -m hvconform.targets.realnode.build --pin` from the release's own go.mod.",
        "module hv.local/nodebuild",
        "",
        f"go {go.group(1) if go else '1.26.0'}",
        "",
        "godebug default=go1.26",
        "",
        f"require k8s.io/kubernetes {KUBERNETES_VERSION}",
        "",
        "replace (",
        *[f"\t{m} => {m} {STAGING_VERSION}" for m in staging],
        ")",
        "",
    ]
    return "\n".join(lines)


def pin() -> None:
    """Rewrite gobuild/build/go.mod from the go.mod of the release, read from the module cache."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
        check=True,
        capture_output=True,
        text=True,
        env=_env(),
        cwd=CACHE,
    ).stdout
    release = Path(json.loads(out)["GoMod"]).read_text()
    (BUILD_MODULES / "build" / "go.mod").write_text(render_build_module(release))


def _stamp(name: str) -> dict[str, object]:
    try:
        data = json.loads((STAMPS / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _workdir(module: str) -> Path:
    """A copy of a committed build module under CACHE: go.sum and the build stay out of the repo."""
    src = BUILD_MODULES / module
    dst = CACHE / "src" / module.replace("/", "-")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            target = dst / f.name
            if not target.exists() or target.read_bytes() != f.read_bytes():
                shutil.copyfile(f, target)
    return dst


def _go(args: list[str], cwd: Path, log: Path, **extra_env: str) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ go {' '.join(args)}\n".encode())
        out.flush()
        env = {**_env(), **extra_env}
        proc = subprocess.run(["go", *args], cwd=cwd, env=env, stdout=out, stderr=out)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"go {args[0]} failed ({proc.returncode}):\n" + "\n".join(tail))


def binary_of(name: str) -> Path:
    """Where component `name` is put (the first of its binaries)."""
    return {
        "cni": BIN / "cni" / CNI_PLUGINS[0],
        "containerd2": CONTAINERD2_BIN / "containerd",
        "runc": CONTAINERD2_BIN / "runc",
    }.get(name, BIN / name)


def build_one(name: str, *, force: bool = False) -> Built:
    version = {
        "etcd": ETCD_VERSION,
        "crictl": CRICTL_VERSION,
        "pause": "local",
        "cni": CNI_VERSION,
        "containerd2": CONTAINERD2_VERSION,
        "runc": RUNC_VERSION,
    }.get(name, KUBERNETES_VERSION)
    binary = binary_of(name)
    if not force and binary.exists() and _stamp(name).get("version") == version:
        return Built(name, version, float(str(_stamp(name).get("seconds", 0.0))), cached=True)
    BIN.mkdir(parents=True, exist_ok=True)
    STAMPS.mkdir(parents=True, exist_ok=True)
    log = CACHE / "logs" / f"build-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    tmp = BIN / f".{name}.new"
    start = time.monotonic()
    if name in KUBE_COMPONENTS:
        cwd = _workdir("build")
        args = ["build", "-p", "1", "-ldflags", _version_ldflags(), "-o", str(tmp)]
        _go([*args, f"k8s.io/kubernetes/cmd/{name}"], cwd, log)
    elif name == "etcd":
        cwd = _workdir("build/etcd")
        _go(
            ["build", "-p", "1", "-ldflags", "-s -w", "-o", str(tmp), "go.etcd.io/etcd/server/v3"],
            cwd,
            log,
        )
    elif name == "crictl":
        gobin = CACHE / "gobin"
        args = ["install", "-p", "1", "-ldflags", "-s -w"]
        _go(
            [*args, f"sigs.k8s.io/cri-tools/cmd/crictl@{CRICTL_VERSION}"],
            CACHE,
            log,
            GOBIN=str(gobin),
        )
        shutil.copyfile(gobin / "crictl", tmp)
    elif name == "cni":
        gobin = CACHE / "gobin"
        module = "github.com/containernetworking/plugins/plugins"
        kinds = {"host-local": "ipam"}
        pkgs = [f"{module}/{kinds.get(p, 'main')}/{p}@{CNI_VERSION}" for p in CNI_PLUGINS]
        _go(["install", "-p", "1", "-ldflags", "-s -w", *pkgs], CACHE, log, GOBIN=str(gobin))
        (BIN / "cni").mkdir(exist_ok=True)
        for plugin in CNI_PLUGINS:
            shutil.copyfile(gobin / plugin, BIN / "cni" / f".{plugin}.new")
            (BIN / "cni" / f".{plugin}.new").chmod(0o755)
            (BIN / "cni" / f".{plugin}.new").replace(BIN / "cni" / plugin)
    elif name in RUNTIME_COMPONENTS:
        gobin = CACHE / "gobin"
        programs: tuple[str, ...]
        if name == "containerd2":
            module = "github.com/containerd/containerd/v2/cmd"
            programs = ("containerd", "containerd-shim-runc-v2")
            pkgs = [f"{module}/{p}@{CONTAINERD2_VERSION}" for p in programs]
            _go(["install", "-p", "1", "-ldflags", "-s -w", *pkgs], CACHE, log, GOBIN=str(gobin))
        else:
            programs = ("runc",)
            pkg = f"github.com/opencontainers/runc@{RUNC_VERSION}"
            if not Path("/usr/include/seccomp.h").is_file():
                raise RuntimeError("runc needs libseccomp-dev (scripts/bootstrap installs it)")
            args = ["install", "-p", "1", "-tags", "seccomp", pkg]
            _go(args, CACHE, log, GOBIN=str(gobin), CGO_ENABLED="1")
        CONTAINERD2_BIN.mkdir(parents=True, exist_ok=True)
        for program in programs:
            new = CONTAINERD2_BIN / f".{program}.new"
            shutil.copyfile(gobin / program, new)
            new.chmod(0o755)
            new.replace(CONTAINERD2_BIN / program)
    elif name == "pause":
        cwd = _workdir("pause")
        _go(["build", "-p", "1", "-ldflags", "-s -w", "-o", str(tmp), "."], cwd, log)
    else:
        raise ValueError(f"unknown component {name!r}")
    seconds = round(time.monotonic() - start, 1)
    if name not in ("cni", *RUNTIME_COMPONENTS):  # those were put in place one by one above
        tmp.chmod(0o755)
        tmp.replace(binary)
    (STAMPS / f"{name}.json").write_text(json.dumps({"version": version, "seconds": seconds}))
    return Built(name, version, seconds, cached=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node-build", description=__doc__.splitlines()[0])
    parser.add_argument("components", nargs="*", default=list(ALL_COMPONENTS))
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--pin", action="store_true", help="rewrite gobuild/build/go.mod first")
    args = parser.parse_args(argv)
    if shutil.which("go") is None:
        print("node-build: no `go` on PATH", file=sys.stderr)
        return 2
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.pin:
        pin()
    total = 0.0
    failed = False
    for name in args.components:
        try:
            built = build_one(name, force=args.force)
        except (RuntimeError, ValueError) as exc:
            print(f"node-build: {name}: FAILED: {exc}", file=sys.stderr)
            failed = True
            continue
        origin = "cached, built in" if built.cached else "built in"
        print(
            f"node-build: {name} {built.version} {origin} {built.seconds:.0f}s -> {binary_of(name)}"
        )
        total += 0.0 if built.cached else built.seconds
    print(f"node-build: this run compiled for {total:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
