"""The binaries the kind node image needs beyond the real node target's (cached in CACHE).

- kind: `go install sigs.k8s.io/kind@KIND_VERSION` into CACHE/gobin (what a run uses when no
  kind is on PATH).
- kubeadm, kubectl, kube-proxy: gobuild/build (the pinned k8s.io/kubernetes module), copied to
  CACHE/src/build, the same version stamps as the node target's components.
- etcd ETCD_VERSION (kubeadm's etcd image of the release), coredns COREDNS_VERSION.
The node target's own builds (kubelet, the control plane, crictl, pause, CNI plugins) are read
from its cache as they are; `nox -s kind-image` runs its builder first (a no-op when cached).
One package at a time; a binary is rebuilt only when missing or its stamp names another version.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hvconform.targets.cluster.kindbin import KIND_BIN, KIND_VERSION
from hvconform.targets.kindnode import BIN, CACHE, COREDNS_VERSION, ETCD_VERSION
from hvconform.targets.realnode import BIN as NODE_BIN
from hvconform.targets.realnode import KUBERNETES_VERSION, REPO
from hvconform.targets.realnode import build as nodebuild

OURS = ("kind", "kubeadm", "kubectl", "kube-proxy", "etcd", "coredns")
# The node target's, reused read-only from its cache (NODE_BIN).
THEIRS = ("kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "crictl",
          "pause", "cni")  # fmt: skip
STAMPS = CACHE / "stamps"
Log = Callable[[str], None]
ETCD_MODULE = (
    f"module hv.local/kindetcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
)


@dataclass(frozen=True)
class Built:
    name: str
    version: str
    path: Path
    seconds: float
    cached: bool


def version_of(name: str) -> str:
    return {
        "kind": KIND_VERSION,
        "etcd": ETCD_VERSION,
        "coredns": COREDNS_VERSION,
    }.get(name, KUBERNETES_VERSION)


def path_of(name: str) -> Path:
    if name == "kind":
        return KIND_BIN
    if name in THEIRS:
        return NODE_BIN / name
    return BIN / name


def _stamp(name: str) -> dict[str, object]:
    try:
        data = json.loads((STAMPS / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _module_dir(name: str) -> Path:
    """A build module of our own under CACHE/src (go.sum and builds stay out of the repo)."""
    dst = CACHE / "src" / name
    dst.mkdir(parents=True, exist_ok=True)
    if name == "build":
        for f in (REPO / "gobuild" / "build").iterdir():
            if f.is_file() and (
                not (dst / f.name).exists() or (dst / f.name).read_bytes() != f.read_bytes()
            ):
                shutil.copyfile(f, dst / f.name)
    else:
        if not (dst / "go.mod").exists() or (dst / "go.mod").read_text() != ETCD_MODULE:
            (dst / "go.mod").write_text(ETCD_MODULE)
            (dst / "go.sum").unlink(missing_ok=True)
        (dst / "doc.go").write_text("package kindetcd\n")
    return dst


def build_one(name: str, *, force: bool = False) -> Built:
    version, binary = version_of(name), path_of(name)
    if name in THEIRS:
        version = str(nodebuild._stamp(name).get("version", "unstamped"))
        if not binary.exists() and not (name == "cni" and (binary / "ptp").exists()):
            raise RuntimeError(f"{name} missing from {NODE_BIN}: run `nox -s node-build`")
        return Built(name, version, binary, 0.0, cached=True)
    if not force and binary.exists() and _stamp(name).get("version") == version:
        return Built(name, version, binary, float(str(_stamp(name).get("seconds", 0.0))), True)
    for d in (BIN, STAMPS, CACHE / "logs", CACHE / "gobin"):
        d.mkdir(parents=True, exist_ok=True)
    log = CACHE / "logs" / f"build-{name}.log"
    tmp = BIN / f".{name}.new"
    start = time.monotonic()
    gobin = {"GOBIN": str(CACHE / "gobin")}
    if name in ("kubeadm", "kubectl", "kube-proxy"):
        args = ["build", "-p", "1", "-ldflags", nodebuild._version_ldflags(), "-o", str(tmp)]
        nodebuild._go([*args, f"k8s.io/kubernetes/cmd/{name}"], _module_dir("build"), log)
    elif name == "etcd":
        args = ["build", "-p", "1", "-ldflags", "-s -w", "-o", str(tmp)]
        nodebuild._go([*args, "go.etcd.io/etcd/server/v3"], _module_dir("etcd"), log)
    elif name in ("kind", "coredns"):
        pkg = {"kind": "sigs.k8s.io/kind", "coredns": "github.com/coredns/coredns"}[name]
        args = ["install", "-p", "1", "-ldflags", "-s -w", f"{pkg}@{version}"]
        nodebuild._go(args, CACHE, log, **gobin)
        if name == "coredns":
            shutil.copyfile(CACHE / "gobin" / "coredns", tmp)
    else:
        raise ValueError(f"unknown component {name!r}")
    seconds = round(time.monotonic() - start, 1)
    if name != "kind":  # go install put kind in place itself
        tmp.chmod(0o755)
        tmp.replace(binary)
    (STAMPS / f"{name}.json").write_text(json.dumps({"version": version, "seconds": seconds}))
    return Built(name, version, binary, seconds, cached=False)


def build_all(log: Log) -> dict[str, Built]:
    out: dict[str, Built] = {}
    for name in (*OURS, *THEIRS):
        built = build_one(name)
        origin = "cached" if built.cached else f"built in {built.seconds:.0f}s"
        log(f"{name} {built.version}: {origin} ({built.path})")
        out[name] = built
    return out


def main(argv: list[str]) -> int:
    """`python -m hvconform.targets.kindnode.build NAME...`: those binaries only (the suite's
    image needs kind and kubectl without the whole node image)."""
    unknown = [n for n in argv if n not in (*OURS, *THEIRS)]
    if unknown or not argv:
        print(f"usage: build NAME... (of {', '.join((*OURS, *THEIRS))})", file=sys.stderr)
        return 2
    for name in argv:
        built = build_one(name)
        origin = "cached" if built.cached else f"built in {built.seconds:.0f}s"
        print(f"kindnode-build: {name} {built.version}: {origin} ({built.path})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
