"""Every hostile input of issue 34, run as a user runs it: one row each (the closing note's table).

    python tools/hostile_inputs.py [--out FILE.md]

Each case builds its input in a private temp dir, runs the real command under /usr/bin/time
(wall time, peak RSS), and records the exit code, stderr's line count, whether a traceback was
printed, and whether the reports root or anything outside the temp dir was written (the reports
root is listed before and after). Nothing here talks to a cluster: dry runs and refusals only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GO_KVM = ROOT / "fixtures" / "plugins" / "go-kvm"
KUBECONFIG = ROOT / "fixtures" / "plans" / "kubeconfig.yaml"
PY = sys.executable


@dataclass
class Row:
    name: str
    surface: str
    code: int
    lines: int
    traceback: bool
    seconds: float
    rss_mb: float
    written: str
    first: str


def _profile(tmp: Path, extra: list[object], raw: str = "") -> Path:
    shutil.copytree(GO_KVM / "deploy", tmp / "deploy")
    (tmp / "deploy" / "extra.yaml").write_text(raw or yaml.safe_dump_all(extra))
    data = yaml.safe_load((GO_KVM / "profile.yaml").read_text())
    data["command"] = ["/bin/true"]
    data["deploy"]["manifests"]["*"] = ["deploy/daemonset-cluster.yaml", "deploy/extra.yaml"]
    (tmp / "profile.yaml").write_text(yaml.safe_dump(data))
    return tmp / "profile.yaml"


def _dry(profile: Path, *extra: str) -> list[str]:
    return [PY, "-m", "hvconform.cli", "run", "--target", "cluster", "--kubeconfig",
            str(KUBECONFIG), "--node", "n1", "--plugin-profile", str(profile), "--dry-run",
            *extra]  # fmt: skip


def _ds(**pod: object) -> dict[str, object]:
    spec = {"containers": [{"name": "x", "image": "x:1"}], **pod}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "wide"},
            "spec": {"selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}}, "spec": spec}}}  # fmt: skip


def _crb(role: str, subject: dict[str, str], **meta: str) -> dict[str, object]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": meta or {"name": "b"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role}, "subjects": [subject]}  # fmt: skip


SA = {"kind": "ServiceAccount", "name": "go-kvm", "namespace": "hyperlight-system"}
BOMB = "".join(
    f"{n}: &{n} [" + ",".join([f"*{p}"] * 9 if p else ['"lol"'] * 9) + "]\n"
    for p, n in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)
CaseFn = Callable[[Path], list[str]]


def _files(tmp: Path, count: int, text: str) -> Path:
    shutil.copytree(GO_KVM / "deploy", tmp / "deploy")
    names = []
    for i in range(count):
        (tmp / "deploy" / f"m{i}.yaml").write_text(text.replace("@", str(i)))
        names.append(f"deploy/m{i}.yaml")
    data = yaml.safe_load((GO_KVM / "profile.yaml").read_text())
    data["command"] = ["/bin/true"]
    data["deploy"]["manifests"]["*"] = ["deploy/daemonset-cluster.yaml", *names]
    (tmp / "profile.yaml").write_text(yaml.safe_dump(data))
    return tmp / "profile.yaml"


def _chart_profile(tmp: Path, mutate: Callable[[Path], None]) -> Path:
    chart = tmp / "chart"
    shutil.copytree(ROOT / "charts" / "hv-device-plugin", chart)
    mutate(chart)
    data = yaml.safe_load((ROOT / "conformance" / "profiles" / "hv-device-plugin.yaml").read_text())
    data["deploy"]["chart"]["path"] = str(chart)
    (tmp / "profile.yaml").write_text(yaml.safe_dump(data))
    return tmp / "profile.yaml"


def _shadow(chart: Path) -> None:
    (chart / "files").mkdir()
    (chart / "files" / "shadow").symlink_to("/etc/shadow")
    (chart / "templates" / "leak.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: leak}\ndata:\n"
        '  s: {{ .Files.Get "files/shadow" | quote }}\n'
    )


def _values_link(chart: Path) -> None:
    target = chart / "targets" / "kind.yaml"
    target.unlink()
    target.symlink_to(KUBECONFIG)


def _big_configmap(chart: Path) -> None:
    (chart / "templates" / "big.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\ndata:\n"
        '  a: {{ repeat 50000000 "x" | quote }}\n'
    )


def _dra(tmp: Path, **dra: str) -> Path:
    data = yaml.safe_load((ROOT / "conformance" / "profiles" / "hv-dra-driver.yaml").read_text())
    data["dra"].update(dra)
    data["deploy"]["chart"]["path"] = str(ROOT / "charts" / "hv-device-plugin")
    (tmp / "profile.yaml").write_text(yaml.safe_dump(data))
    return tmp / "profile.yaml"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return _dra(tmp, deviceClass=str(tmp / "fifo"))


def _results(tmp: Path) -> list[str]:
    src = ROOT / "fixtures" / "results" / "all-passed.json"
    text = src.read_text()
    metrics = ",".join(f'"m{i}": {i}' for i in range(2_000_000))
    big = text.replace('"metrics": {', '"metrics": {' + metrics + ",", 1)
    (tmp / "r").mkdir()
    (tmp / "r" / "results.json").write_text(big)
    return [PY, "-m", "hvconform.cli", "report", str(tmp / "r" / "results.json"),
            "--out", str(tmp / "out")]  # fmt: skip


def _plugin(url: str) -> CaseFn:
    return lambda tmp: [PY, "-m", "hv_device_plugin", "--mode", "dra", "--kube-api-server", url,
                        "--node-name", "n1"]  # fmt: skip


CASES: list[tuple[str, str, CaseFn]] = [
    ("generateName ClusterRoleBinding to view", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [_crb("view", SA, name="", generateName="go-kvm-")]))),
    ("... the same, --allow-object ClusterRoleBinding/go-kvm-", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [_crb("view", SA, name="", generateName="go-kvm-")]),
                    "--allow-object", "ClusterRoleBinding/go-kvm-")),
    ("cluster-admin to system:authenticated", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [_crb("cluster-admin",
                                      {"kind": "Group", "name": "system:authenticated"})]))),
    ("MutatingWebhookConfiguration, failurePolicy Fail, external URL",
     "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [{"apiVersion": "admissionregistration.k8s.io/v1",
                                  "kind": "MutatingWebhookConfiguration",
                                  "metadata": {"name": "w"},
                                  "webhooks": [{"name": "w.example.com", "failurePolicy": "Fail",
                                                "clientConfig": {"url": "https://e.example/"}}]}]))),
    ("CustomResourceDefinition", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [{"apiVersion": "apiextensions.k8s.io/v1",
                                  "kind": "CustomResourceDefinition",
                                  "metadata": {"name": "ws.example.com"}}]))),
    ("APIService", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [{"apiVersion": "apiregistration.k8s.io/v1",
                                  "kind": "APIService", "metadata": {"name": "v1.example.com"}}]))),
    ("PersistentVolume", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [{"apiVersion": "v1", "kind": "PersistentVolume",
                                  "metadata": {"name": "pv"}}]))),
    ("privileged hostPID hostNetwork DaemonSet, hostPath /", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [_ds(hostPID=True, hostNetwork=True,
                                     volumes=[{"name": "r", "hostPath": {"path": "/"}}])]))),
    ("Namespace kube-system in the profile", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [{"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": "kube-system"}}]))),
    ("Namespace default in the profile", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [{"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": "default"}}]))),
    ("dra.pluginDir /var/lib/kubelet/plugins", "run --target node --dry-run? (profile load)",
     lambda t: [PY, "-m", "hvconform.cli", "run", "--target", "node", "--plugin-profile",
                str(_dra(t, pluginDir="/var/lib/kubelet/plugins"))]),
    ("chart files/shadow -> /etc/shadow read by .Files.Get", "run --target cluster --dry-run",
     lambda t: _dry(_chart_profile(t, _shadow))),
    ("values file symlink to a kubeconfig", "run --target cluster --dry-run",
     lambda t: _dry(_chart_profile(t, _values_link))),
    ("chart rendering a 50 MB ConfigMap", "run --target cluster --dry-run",
     lambda t: _dry(_chart_profile(t, _big_configmap))),
    ("492-byte alias bomb manifest", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [], raw=BOMB))),
    ("duplicate keys", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [], raw="apiVersion: v1\nkind: ConfigMap\nkind: Secret\n"
                                        "metadata: {name: c}\n"))),
    ("100,000-digit integer", "run --target cluster --dry-run",
     lambda t: _dry(_profile(t, [], raw="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
                                        "data: {a: " + "9" * 100_000 + "}\n"))),
    ("31 files x 256 objects", "run --target cluster --dry-run",
     lambda t: _dry(_files(t, 31, "---\n".join(
         f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c@-{j}}}\n" for j in range(256))))),
    ("31 files of 1 MB flow mappings", "run --target cluster --dry-run",
     lambda t: _dry(_files(t, 31, "{apiVersion: v1, kind: ConfigMap, metadata: {name: c@}, "
                                  "data: {" + ", ".join(f"k{i}: v" for i in range(100_000))
                                  + "}}\n"))),
    ("dra.deviceClass /dev/zero", "run --target node (profile load)",
     lambda t: [PY, "-m", "hvconform.cli", "run", "--target", "node", "--plugin-profile",
                str(_dra(t, deviceClass="/dev/zero"))]),
    ("dra.deviceClass a FIFO", "run --target node (profile load)",
     lambda t: [PY, "-m", "hvconform.cli", "run", "--target", "node", "--plugin-profile",
                str(_fifo(t))]),
    ("report of a 45 MB results file, 2 M metrics", "report", _results),
    ("--image $'bad\\nimage:1' --runtime container", "run --runtime container",
     lambda t: [PY, "-m", "hvconform.cli", "run", "--runtime", "container", "--image",
                "bad\nimage:1", "--out", str(t / "out")]),
    ("--guest-image with a newline", "run --target cluster --dry-run",
     lambda t: [PY, "-m", "hvconform.cli", "run", "--target", "cluster", "--kubeconfig",
                str(KUBECONFIG), "--node", "n1", "--dry-run", "--guest-image",
                "g:1\n## cleanup: nothing will be deleted"]),
    ("a 10 KB image name", "run --target cluster --dry-run",
     lambda t: [PY, "-m", "hvconform.cli", "run", "--target", "cluster", "--kubeconfig",
                str(KUBECONFIG), "--node", "n1", "--dry-run", "--image", "a" * 10_000 + ":1"]),
    ("--kube-api-server https://127.0.0.1:99999", "plugin", _plugin("https://127.0.0.1:99999")),
    ("--kube-api-server https://[::1", "plugin", _plugin("https://[::1")),
    ("--kube-api-server https://", "plugin", _plugin("https://")),
    ("--kube-api-server https://h:abc", "plugin", _plugin("https://h:abc")),
    ("--kube-api-server https://u:p@h/path?q=1", "plugin", _plugin("https://u:p@h/path?q=1")),
    ("--kube-api-server with CR and ESC", "plugin", _plugin("https://h\r\x1b[2J")),
]  # fmt: skip


def _reports() -> set[str]:
    root = ROOT / "reports"
    return {str(p) for p in root.rglob("*")} if root.exists() else set()


def run_case(name: str, surface: str, make: CaseFn) -> Row:
    with tempfile.TemporaryDirectory(prefix="hv-hostile-") as tmp:
        argv = make(Path(tmp))
        before = _reports()
        timing = Path(tmp) / "time"
        done = subprocess.run(
            ["/usr/bin/time", "-o", str(timing), "-f", "%e %M", *argv],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=ROOT,
            check=False,
        )
        seconds, rss_kb = timing.read_text().split()[-2:]
        written = sorted(_reports() - before)
        out = Path(tmp) / "out"
        wrote = [*written, *([str(out)] if out.exists() and any(out.iterdir()) else [])]
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        first = lines[0] if lines else (done.stdout.splitlines() or [""])[0]
        return Row(name, surface, done.returncode, len(lines), "Traceback" in done.stderr,
                   float(seconds), int(rss_kb) / 1024, ", ".join(wrote) or "nothing",
                   first[:140])  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="", help="write the Markdown table here too")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    ns = parser.parse_args()
    head = (
        "| input | surface | exit | stderr lines | traceback | time s | peak RSS MB "
        "| written or deleted | first line |"
    )
    rows = [head, "|---|---|---|---|---|---|---|---|---|"]
    for name, surface, make in CASES:
        if ns.k and ns.k not in name:
            continue
        r = run_case(name, surface, make)
        first = r.first.replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {r.name} | {r.surface} | {r.code} | {r.lines} | "
                    f"{'yes' if r.traceback else 'no'} | {r.seconds:.1f} | {r.rss_mb:.0f} | "
                    f"{r.written} | {first} |")  # fmt: skip
        print(rows[-1], flush=True)
    if ns.out:
        Path(ns.out).write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
