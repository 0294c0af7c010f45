"""`hvconform sonobuoy-node`: the suite in the pod of the node it judges (the Sonobuoy plugin's
container, one per node of the DaemonSet).

It runs `hvconform run --target cluster` with this node's name, `--node-access host-pid` (the
pod is privileged and hostPID: node commands enter PID 1's namespaces, as the diagnostic pod's
do) and a kubeconfig made from the pod's own service account, so the run validates its inputs
once, exactly as on a laptop. Then it writes what Sonobuoy reads (the manual-format YAML of
hvconform.sonobuoy.results) beside the run's results.json, report and junit.xml, and tells the
Sonobuoy worker where they are (the done file). A DaemonSet restarts a container that exits, so
once done it waits for its pod's end instead of exiting: one run per node.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hvconform.contract.runcontext import MODES
from hvconform.contract.safewrite import write_atomic
from hvconform.sonobuoy.results import MANUAL_FILE, manual_tree

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESULTS_DIR = "/tmp/sonobuoy/results"  # Sonobuoy's default (SONOBUOY_RESULTS_DIR overrides)
OUT = "out"  # the dir the node's files are written to (sent as ARCHIVE)
RUN_DIR = "hvconform"  # the suite's own run dir inside it
ARCHIVE = "hvconform-results.tar.gz"  # what the done file names: the out dir, gzipped


def in_cluster_kubeconfig(dest: Path, environ: dict[str, str], sa: Path = SERVICE_ACCOUNT) -> Path:
    """A kubeconfig of the pod's service account (the run's --kubeconfig), mode 0600."""
    host, port = (
        environ.get("KUBERNETES_SERVICE_HOST", ""),
        environ.get("KUBERNETES_SERVICE_PORT", ""),
    )
    token, ca = sa / "token", sa / "ca.crt"
    if not host or not token.is_file() or not ca.is_file():
        raise RuntimeError(
            "not in a pod with a service account (KUBERNETES_SERVICE_HOST and "
            f"{token} needed): run this inside the Sonobuoy plugin's pod"
        )
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": {"server": server,
                                                         "certificate-authority": str(ca)}}],
        "users": [{"name": "sa", "user": {"token": token.read_text().strip()}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "sa"}}],
        "current-context": "in-cluster",
    }  # fmt: skip
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(dest, yaml.safe_dump(config), mode=0o600)
    return dest


def run_argv(ns: argparse.Namespace, kubeconfig: Path, out: Path) -> list[str]:
    """The one `hvconform run` this node's pod makes."""
    argv = [sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster",
            "--kubeconfig", str(kubeconfig), "--node", ns.node, "--node-access", "host-pid",
            "--mode", ns.mode, "--out", str(out)]  # fmt: skip
    if ns.deployed:
        argv += ["--deployed", ns.deployed]
    if ns.allow_disruption:
        argv.append("--allow-disruption")
    for flag, value in (("--plugin-profile", ns.plugin_profile), ("--guest-image", ns.guest_image),
                        ("--image", ns.image)):  # fmt: skip
        if value:
            argv += [flag, value]
    return [*argv, *ns.run_args]


def finish(
    results_dir: Path, node: str, refused: str = "", cost: dict[str, float] | None = None
) -> Path:
    """Write the manual YAML beside the run's files; the done file names the out dir."""
    out = results_dir / OUT
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / RUN_DIR / "results.json"
    results: dict[str, Any] = {}
    if results_file.is_file():
        try:
            results = json.loads(results_file.read_text())
        except ValueError:
            refused = refused or f"{results_file} is not JSON"
    elif not refused:
        refused = "the run wrote no results.json (its log is in the pod's output)"
    tree = manual_tree(results, node, refused, cost)
    write_atomic(out / MANUAL_FILE, yaml.safe_dump(tree, sort_keys=False))
    # One gzip tarball, made here: the worker (another user in Sonobuoy's image) sends a file
    # as it is, where a directory it would have to tar into the dir this container owns.
    archive = results_dir / ARCHIVE
    partial = archive.with_name(f".{ARCHIVE}.new")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(out.rglob("*")):
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=str(path.relative_to(out)), recursive=False)
    partial.chmod(0o644)
    partial.replace(archive)
    write_atomic(results_dir / "done", str(archive))
    return out


def wait_for_pod_end() -> None:
    """Block until SIGTERM (the pod's deletion): a DaemonSet would run an exited container
    again, and this node has had its run."""
    ended = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: ended.set())
    ended.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument("--node", default=env.get("NODE_NAME", ""),
                        help="the node this pod runs on [NODE_NAME, from the downward API]")  # fmt: skip
    parser.add_argument("--mode", choices=MODES, default="validate",
                        help="validate (default: disturbs nothing) or full (the node must be "
                        "cordoned, or --allow-disruption)")  # fmt: skip
    parser.add_argument("--deployed", default="", metavar="NAMESPACE/DAEMONSET",
                        help="the plugin as it runs on the node (validate mode)")  # fmt: skip
    parser.add_argument("--allow-disruption", action="store_true",
                        help="full mode on a node that is not cordoned")  # fmt: skip
    parser.add_argument("--plugin-profile", default="", metavar="FILE")
    parser.add_argument("--guest-image", default="")
    parser.add_argument("--image", default="")
    parser.add_argument("--results-dir", default=env.get("SONOBUOY_RESULTS_DIR", RESULTS_DIR))
    parser.add_argument("--no-wait", action="store_true",
                        help="exit when done (outside a DaemonSet)")  # fmt: skip
    parser.add_argument("run_args", nargs="*", help="more `hvconform run` flags, after --")


def run(ns: argparse.Namespace) -> int:
    if not ns.node:
        print("hvconform sonobuoy-node: no node name (--node, or NODE_NAME)", file=sys.stderr)
        return 2
    results_dir = Path(ns.results_dir)
    work = Path(tempfile.gettempdir()) / "hvconform-node"
    code = 0
    try:
        kubeconfig = in_cluster_kubeconfig(work / "kubeconfig", dict(os.environ))
    except RuntimeError as exc:
        finish(results_dir, ns.node, refused=str(exc))
        print(f"hvconform sonobuoy-node: {exc}", file=sys.stderr)
        code = 2
    else:
        argv = run_argv(ns, kubeconfig, results_dir / OUT / RUN_DIR)
        print(f"hvconform sonobuoy-node: node {ns.node}, mode {ns.mode}", flush=True)
        t0, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        code = subprocess.run(argv, check=False).returncode  # its output is the pod's log
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        cost = {
            "wall_s": round(time.monotonic() - t0, 3),
            "cpu_s": round(used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime, 3),
        }
        out = finish(results_dir, ns.node, cost=cost)
        print(f"hvconform sonobuoy-node: exit {code}; results in {out}", flush=True)
    if not ns.no_wait:
        wait_for_pod_end()
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "sonobuoy-node",
        help="the suite in the pod of the node it judges (the Sonobuoy plugin's container)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hvconform sonobuoy-node")
    add_arguments(parser)
    return run(parser.parse_args(argv))
