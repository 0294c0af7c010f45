"""The conformance catalogue's verdict matrix: every check's status per plugin and target.

    python3 tools/verdict_matrix.py run --checkout DIR --out DIR [--plugins ours,go-kvm]
        [--targets local,container,node,cluster,kind] [--deadline-min 40]
    python3 tools/verdict_matrix.py compare BEFORE/matrix.json AFTER/matrix.json

For comparing two revisions of the suite (before and after a redesign): `run` drives any checkout,
old or new, only through its `dev` entry point, nox sessions and `hvconform` console script, never
importing the suite (its import names changed). The runs are sequential: the node, cluster and
kind targets share this machine's one real node. Each run's --out and console log go to
OUT/<plugin>-<target>/; OUT/matrix.json and OUT/matrix.md collect the verdicts. Standard library
only, so it runs under any python3 >= 3.11 with no venv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# None: this repository's shipped profile (hvconform's default); otherwise relative to the checkout.
PLUGINS: dict[str, str | None] = {"ours": None, "go-kvm": "fixtures/plugins/go-kvm/profile.yaml"}
TARGETS = ("local", "container", "node", "cluster", "kind")
LEFTOVER = re.compile(r"hv-(docker|node|kind)")
# nox answers 1 for any failure; the suite's own exit code (2 bad input, 3 suite broke, ...) is
# only in the line nox prints, so it is read back from the log for the nox-run targets.
NOX_FAILED = re.compile(r"Command hvconform .* failed with exit code (\d+)")


def stamp() -> str:
    return time.strftime("%H:%M:%S")


def kvm_identity() -> str:
    """/dev/kvm's mode, owner, group and device number: it must never change across a run."""
    st = os.stat("/dev/kvm")
    return f"{st.st_mode:o} {st.st_uid}:{st.st_gid} {os.major(st.st_rdev)},{os.minor(st.st_rdev)}"


def leftover_mounts() -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if LEFTOVER.search(line)]


def command(checkout: Path, plugin: str, target: str, out: Path) -> list[str]:
    """The argv each target's own live tests (or its nox session) use, for this plugin."""
    profile = PLUGINS[plugin]
    extra = ["--plugin-profile", str(checkout / profile)] if profile else []
    hvconform = str(checkout / ".nox" / "conformance" / "bin" / "hvconform")
    nox = [str(checkout / "dev"), "nox", "-s"]
    if target == "local":  # as `nox -s conformance` / `./dev conform` run it
        return [hvconform, "run", "-n", "auto", *extra, "--out", str(out)]
    if target == "container":  # serial, as tests/container runs it
        return [hvconform, "run", "--runtime", "container", *extra, "--out", str(out)]
    if target == "node":  # the target itself makes it serial (one real node per machine)
        return [hvconform, "run", "--target", "node", *extra, "--out", str(out)]
    if target == "cluster":  # node-up, images imported, the run, node-down: all in the session
        return [*nox, "conformance-cluster", "--", "--nodes", "1", *extra, "--out", str(out)]
    # kind: the session copies the profile's image into the kind engine and names the node image
    return [*nox, "conformance-kind", "--", *extra, "--out", str(out)]


def execute(argv: list[str], cwd: Path, log: Path, deadline_s: float) -> tuple[int | None, bool]:
    """Run argv in its own process group; (exit code or None, timed out). On the deadline the
    group gets SIGINT first (the suite cleans up on Ctrl-C, nox runs its finally), then SIGKILL."""
    with log.open("ab") as f:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=deadline_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None, True


def verdicts(out: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Statuses and non-pass reasons from every results.json below out (the cluster target
    writes one per node, OUT/<node>/); a check the nodes judged differently shows each node's."""
    files = sorted(out.rglob("results.json"))
    per_file = [json.loads(p.read_text())["checks"] for p in files]
    status: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for path, checks in zip(files, per_file, strict=True):
        node = path.parent.name
        for c in checks:
            s = str(c["status"])
            if len(files) > 1 and status.get(c["id"], s) != s:
                s = f"{status[c['id']]} / {node}={s}"
            status[c["id"]] = s
            if c["status"] != "passed" and c.get("reason"):
                reasons[c["id"]] = str(c["reason"])[:400]
    return status, reasons, [str(p) for p in files]


def run_all(ns: argparse.Namespace) -> int:
    checkout, out = ns.checkout.resolve(), ns.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    matrix_file = out / "matrix.json"
    # Earlier runs into the same --out stay: a re-run of one cell updates only that cell.
    data: dict[str, Any] = json.loads(matrix_file.read_text()) if matrix_file.exists() else {}
    data.setdefault("matrix", {})
    data.setdefault("runs", {})
    rev = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    data.update(checkout=str(checkout), commit=rev.stdout.strip())
    hvconform = checkout / ".nox" / "conformance" / "bin" / "hvconform"
    if not hvconform.exists():  # the session's venv, made once; its commands are not run
        print(f"[{stamp()}] preparing {hvconform} (nox -s conformance --install-only)", flush=True)
        execute(
            [str(checkout / "dev"), "nox", "-s", "conformance", "--install-only"],
            checkout,
            out / "prepare.log",
            ns.deadline_min * 60,
        )
    for plugin in ns.plugins.split(","):
        for target in ns.targets.split(","):
            one(ns, checkout, out, data, plugin, target)
            matrix_file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            (out / "matrix.md").write_text(markdown(data))
    print(f"[{stamp()}] wrote {matrix_file} and {out / 'matrix.md'}", flush=True)
    return 0


def one(
    ns: argparse.Namespace,
    checkout: Path,
    out: Path,
    data: dict[str, Any],
    plugin: str,
    target: str,
) -> None:
    """One plugin x target run, recorded whatever happens to it."""
    name = f"{plugin}-{target}"
    cell = out / name
    if cell.exists():  # --out must be new or empty: keep the earlier attempt beside it
        cell.rename(out / f"{name}.prev-{int(time.time())}")
    cell.mkdir()
    run_out, log = cell / "run", cell / "console.log"
    argv = command(checkout, plugin, target, run_out)
    kvm_before = kvm_identity()
    print(f"[{stamp()}] start {name}: {' '.join(argv)}", flush=True)
    started = time.monotonic()
    code, timed_out = execute(argv, checkout, log, ns.deadline_min * 60)
    seconds = round(time.monotonic() - started, 1)
    inner = NOX_FAILED.findall(log.read_text(errors="replace"))
    record: dict[str, Any] = {
        "command": argv,
        "exit": code,
        "suite_exit": int(inner[-1]) if inner else code,
        "seconds": seconds,
        "timed_out": timed_out,
        "kvm_before": kvm_before,
    }
    if target in ("node", "cluster") and any("hv-node" in m for m in leftover_mounts()):
        # A stopped session can leave its node up; the next target needs this machine's node.
        execute([str(checkout / "dev"), "nox", "-s", "node-down"], checkout, log, 600)
        record["node_down_after"] = True
    record["kvm_after"] = kvm_identity()
    record["leftover_mounts"] = leftover_mounts()
    try:
        status, reasons, files = verdicts(run_out)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a half-written results.json
        status, reasons, files = {}, {}, []
        record["note"] = f"results unreadable: {exc}"
    record.update(reasons=reasons, results=files)
    if not files:
        record.setdefault("note", "no results.json: see console.log")
    data["matrix"].setdefault(plugin, {})[target] = status
    data["runs"].setdefault(plugin, {})[target] = record
    counts: dict[str, int] = {}
    for s in status.values():
        counts[s] = counts.get(s, 0) + 1
    print(
        f"[{stamp()}] end {name}: exit {code} (suite {record['suite_exit']}), "
        f"{seconds / 60:.1f} min, {counts or record.get('note')}"
        f"{', TIMED OUT' if timed_out else ''}"
        f"{', /dev/kvm CHANGED' if kvm_before != record['kvm_after'] else ''}"
        f"{', leftover ' + str(record['leftover_mounts']) if record['leftover_mounts'] else ''}",
        flush=True,
    )


def markdown(data: dict[str, Any]) -> str:
    lines = [f"# Verdict matrix: {data.get('checkout', '')} @ {data.get('commit', '')[:12]}", ""]
    # PLUGINS' order, not matrix.json's sorted keys: this repository's plugin first
    for plugin in [p for p in PLUGINS if p in data["matrix"]]:
        by_target = data["matrix"][plugin]
        targets = [t for t in TARGETS if t in by_target]
        # sorted: the same rows in every matrix, so two of them read side by side
        rows = sorted({c for t in targets for c in by_target[t]})
        lines += [
            f"## {plugin}",
            "",
            "| check | " + " | ".join(targets) + " |",
            "| --- |" + " --- |" * len(targets),
        ]
        for check in rows:
            cells = [by_target[t].get(check, "-") for t in targets]
            lines.append(f"| {check} | " + " | ".join(cells) + " |")
        lines.append("")
        for t in targets:
            run = data["runs"][plugin][t]
            extra = " (timed out)" if run["timed_out"] else ""
            extra += f"; {run['note']}" if run.get("note") else ""
            lines.append(
                f"- {t}: exit {run['exit']} (suite {run['suite_exit']}), "
                f"{run['seconds'] / 60:.1f} min{extra}"
            )
        lines.append("")
    return "\n".join(lines)


def compare(ns: argparse.Namespace) -> int:
    before = json.loads(ns.before.read_text())["matrix"]
    after = json.loads(ns.after.read_text())["matrix"]
    equal = 0
    for plugin in sorted({*before, *after}):
        b_plugin, a_plugin = before.get(plugin, {}), after.get(plugin, {})
        for target in [t for t in TARGETS if t in b_plugin or t in a_plugin]:
            b, a = b_plugin.get(target, {}), a_plugin.get(target, {})
            for check in sorted({*b, *a}):
                was, now = b.get(check, "-"), a.get(check, "-")
                if was == now:
                    equal += 1
                else:
                    print(f"{plugin} {target} {check}: {was} -> {now}")
    print(f"{equal} cells equal")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every plugin x target of a checkout, sequentially")
    run.add_argument("--checkout", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--plugins", default=",".join(PLUGINS))
    run.add_argument("--targets", default=",".join(TARGETS))
    run.add_argument("--deadline-min", type=float, default=40.0, help="per run")
    cmp = sub.add_parser("compare", help="cells that differ between two matrix.json files")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    ns = parser.parse_args(argv)
    if ns.command == "compare":
        return compare(ns)
    unknown = {*ns.plugins.split(",")} - {*PLUGINS} | {*ns.targets.split(",")} - {*TARGETS}
    if unknown:
        parser.error(f"unknown plugin or target: {', '.join(sorted(unknown))}")
    return run_all(ns)


if __name__ == "__main__":
    sys.exit(main())
