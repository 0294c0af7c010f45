"""`hvconform fleet-report`: per-node results merged into one pool report.

Every node's results.json is written by the suite's own writer (CheckRecord, Recorder.metric,
write_results: the shipped schema checks each), so what is merged is what a run leaves. The
pool: three nodes, node-b failing one check, node-c on another kernel and four hundred times
slower in one figure. Sonobuoy tarballs are built with tarfile here, hostile ones too; the
command line is also run in a child process to prove a refusal is one line and no traceback.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.results import CheckRecord, Recorder, Status, write_results
from hvconform.fleet import sources, stats
from hvconform.fleet.cli import main

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "6.1.0-18-amd64"
CHECKS = (("cdi-missing", "cdi"), ("restart-plugin", "restart"), ("device-unusable", "identity"))


def results(
    dest: Path,
    node: str | None,
    *,
    kernel: str = KERNEL,
    status: dict[str, Status] | None = None,
    recovery_s: float = 0.010,
    kvm_gid: int = 0,
) -> Path:
    """dest/results.json of one node's run, through the suite's writer."""
    dest.mkdir(parents=True, exist_ok=True)
    records = []
    for check_id, marker in CHECKS:
        rec = Recorder(CheckRecord(check_id, marker, f"{check_id} title"), dest / "evidence")
        rec.metric("recovery_s", recovery_s if check_id == "restart-plugin" else 0.004)
        rec.metric("guests", 3)
        rec.metric("cdi_device", "hyperlight.dev/hypervisor=kvm")  # text: never a figure
        found = (status or {}).get(check_id, Status.PASSED)
        rec.record.status = found.value
        if found is Status.FAILED:
            rec.record.reason, rec.record.failure = "the spec was not rewritten", "assertion"
        elif found is not Status.PASSED:
            rec.record.reason = f"{check_id}: {found.value} here"
        records.append(rec.record)
    kvm = {"present": True, "major": 10, "minor": 232, "mode": "0o660", "uid": 0, "gid": kvm_gid}
    environment: dict[str, Any] = {
        "kernel": "6.12.0-suite-host",  # the suite's host: a cluster node's own kernel wins
        "machine": "x86_64",
        "distribution": "Debian GNU/Linux 12 (bookworm)",
        "cgroup": {"version": "v2", "driver": "systemd"},
        "python": "3.11.2",
        "plugin_version": "0.1.0",
        "suite_version": "0.1.0",
        "source_commit": "0" * 40,
        "devices": {"/dev/kvm": kvm, "/dev/mshv": {"present": False, "error": "No such file"}},
        "hostname": "suite-host",
    }
    if node is not None:
        environment["cluster"] = {
            "node": node,
            "kernel": kernel,
            "kubelet": "v1.33.1",
            "container_runtime": "containerd://1.7.24",
            "os_image": "Debian GNU/Linux 12 (bookworm)",
        }
    else:
        environment["kernel"] = kernel
        del environment["hostname"]
    run = {
        "id": f"run-{node}",
        "target": "cluster",
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:10:00Z",
        "duration_s": 600.0,
        "exit_code": 0,
    }
    write_results(dest / "results.json", run, environment, records)
    return dest / "results.json"


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    """OUT/<node>/results.json as `hvconform run --target cluster --nodes` leaves them."""
    out = tmp_path / "pool"
    results(out / "node-a", "node-a", recovery_s=0.010)
    results(out / "node-b", "node-b", recovery_s=0.011, status={"cdi-missing": Status.FAILED})
    results(out / "node-c", "node-c", recovery_s=4.0, kernel="6.8.0-49-generic", kvm_gid=36)
    return out


def fleet_report(*args: str | Path) -> tuple[int, dict[str, Any] | None]:
    """Run the command in this process; (exit code, fleet.json when one was written)."""
    argv = [str(a) for a in args]
    code = main(argv)
    out = Path(argv[argv.index("--out") + 1]) / "fleet.json"
    return code, json.loads(out.read_text()) if out.exists() else None


def hvconform(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HV_")}
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "fleet-report", *map(str, args)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failure_a_kernel_and_an_outlier_are_named(pool: Path, tmp_path: Path) -> None:
    code, fleet = fleet_report(pool, "--out", tmp_path / "r")
    assert code == 1 and fleet is not None
    assert fleet["schema"] == "hvconform-fleet" and fleet["schema_version"] == "1.0"
    assert fleet["verdict"] == "failed"
    assert [n["name"] for n in fleet["nodes"]] == ["node-a", "node-b", "node-c"]
    assert {n["named_by"] for n in fleet["nodes"]} == {"environment.cluster.node"}
    assert [(f["node"], f["check"]) for f in fleet["failures"]] == [("node-b", "cdi-missing")]
    assert fleet["verdict_reasons"][0].startswith("node-b: cdi-missing failed: the spec")
    grid = {c["id"]: c["statuses"] for c in fleet["checks"]}
    assert grid["cdi-missing"] == {"node-a": "passed", "node-b": "failed", "node-c": "passed"}
    diffs = {d["field"]: d["values"] for d in fleet["environment_differences"]}
    assert set(diffs) == {"kernel", "device /dev/kvm gid"}  # runtime, kubelet, OS: the same
    assert diffs["kernel"] == [
        {"value": KERNEL, "nodes": ["node-a", "node-b"]},
        {"value": "6.8.0-49-generic", "nodes": ["node-c"]},
    ]
    figures = {(f["check"], f["name"]): f for f in fleet["figures"]}
    assert ("cdi-missing", "cdi_device") not in figures  # text: no distribution
    slow = figures[("restart-plugin", "recovery_s")]
    assert (slow["min"], slow["median"], slow["p95"], slow["max"]) == (0.01, 0.011, 4.0, 4.0)
    assert slow["outliers"] == [{"node": "node-c", "value": 4.0}]
    same = figures[("restart-plugin", "guests")]
    assert same["outliers"] == [] and same["count"] == 3
    text = (tmp_path / "r" / "fleet.txt").read_text()
    assert "Pool verdict: FAILED (3 nodes)" in text and "node-c=4" in text
    html = (tmp_path / "r" / "fleet.html").read_text()
    assert "Pool verdict: FAILED" in html and '<span class="outlier">node-c: 4</span>' in html


def test_a_pool_that_passed_lists_what_it_did_not_verify(tmp_path: Path) -> None:
    na = {"device-unusable": Status.NOT_APPLICABLE}
    results(tmp_path / "in" / "a", "node-a")
    results(tmp_path / "in" / "b", "node-b", status=na)
    code, fleet = fleet_report(tmp_path / "in", "--out", tmp_path / "r", "--expect-nodes", "2")
    assert code == 0 and fleet is not None
    assert fleet["verdict"] == "passed" and fleet["environment_differences"] == []
    assert [(f["node"], f["check"], f["status"]) for f in fleet["not_verified"]] == [
        ("node-b", "device-unusable", "not_applicable")
    ]
    assert "Not verified (never counted as passed):" in (tmp_path / "r" / "fleet.txt").read_text()


@pytest.mark.parametrize(
    ("options", "blocked", "reason"),
    [
        ((), {"restart-plugin": Status.ENVIRONMENT_BLOCKED}, "node-b: restart-plugin"),
        ((), {"restart-plugin": Status.BLOCKED}, "node-b: restart-plugin blocked"),
        (("--nodes", "node-a,node-b,node-z"), {}, "node-z: expected, but no results found"),
        (("--expect-nodes", "3"), {}, "(pool): expected 3 nodes, found 2"),
    ],
    ids=["environment-blocked", "blocked", "named-node-missing", "too-few-nodes"],
)
def test_an_unfinished_pool_is_incomplete(
    tmp_path: Path, options: tuple[str, ...], blocked: dict[str, Status], reason: str
) -> None:
    results(tmp_path / "in" / "a", "node-a")
    results(tmp_path / "in" / "b", "node-b", status=blocked)
    code, fleet = fleet_report(tmp_path / "in", "--out", tmp_path / "r", *options)
    assert code == 1 and fleet is not None
    assert fleet["verdict"] == "incomplete" and fleet["failures"] == []
    assert any(line.startswith(reason) for line in fleet["verdict_reasons"]), fleet


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **fields: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _targz(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            _add(tar, name, data)
    return buf.getvalue()


def test_a_sonobuoy_tarball_is_read_in_memory(tmp_path: Path) -> None:
    """node-x's results name no node (its Sonobuoy directory does) and sit in a nested
    results.tar.gz; node-y's name their node and sit in the node directory itself."""
    x = results(tmp_path / "x", None).read_bytes()
    y = results(tmp_path / "y", "node-y", kernel="6.8.0-49-generic").read_bytes()
    nested = _targz([("results.json", x), ("evidence/log.txt", b"log\n")])
    tarball = tmp_path / "202601011200_sonobuoy_0b1f.tar.gz"
    tarball.write_bytes(
        _targz(
            [
                ("meta/run.log", b"{}\n"),
                ("plugins/hvconform/results/node-x/results.tar.gz", nested),
                ("plugins/hvconform/results/node-y/hvconform/results.json", y),
                ("plugins/hvconform/sonobuoy_results.yaml", b"name: hvconform\n"),
            ]
        )
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    code, fleet = fleet_report(tarball, "--out", tmp_path / "r", "--nodes", "node-x,node-y")
    assert code == 0 and fleet is not None, fleet
    nodes = {n["name"]: n for n in fleet["nodes"]}
    assert nodes["node-x"]["named_by"].startswith("the Sonobuoy node directory")
    assert nodes["node-x"]["source"].endswith("node-x/results.tar.gz!results.json")
    assert nodes["node-y"]["named_by"] == "environment.cluster.node"
    assert fleet["expected"]["missing"] == []
    kernel = next(d for d in fleet["environment_differences"] if d["field"] == "kernel")
    assert kernel["values"] == [
        {"value": KERNEL, "nodes": ["node-x"]},
        {"value": "6.8.0-49-generic", "nodes": ["node-y"]},
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "r"])  # no extraction


def _hostile(kind: str, good: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        base = "plugins/hvconform/results/node-a/"
        if kind == "absolute":
            _add(tar, "/etc/results.json", good)
        elif kind == "dotdot":
            _add(tar, base + "../../../../../results.json", good)
        elif kind == "symlink":
            _add(tar, base + "results.json", type=tarfile.SYMTYPE, linkname="/etc/shadow")
        elif kind == "hardlink":
            _add(tar, base + "results.json", type=tarfile.LNKTYPE, linkname="etc/shadow")
        elif kind == "device":
            _add(tar, base + "kvm", type=tarfile.CHRTYPE, devmajor=10, devminor=232)
        elif kind == "oversized":
            _add(tar, base + "results.json", good + b" " * 4096)
        elif kind == "nested-deep":
            inner = _targz([("results.tar.gz", _targz([("results.json", good)]))])
            _add(tar, base + "results.tar.gz", inner)
        elif kind == "not-json":
            _add(tar, base + "results.json", b"\x00\x01binary")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("absolute", "outside the archive"),
        ("dotdot", "outside the archive"),
        ("symlink", "a link (symbolic), refused"),
        ("hardlink", "a link (hard), refused"),
        ("device", "neither a file nor a directory"),
        ("oversized", "per member"),
        ("nested-deep", "nested more than 2 deep"),
        ("not-json", "a binary file"),
        ("not-a-tarball", "not a readable tarball"),
    ],
)
def test_a_hostile_tarball_is_refused_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    kind: str, said: str,
) -> None:  # fmt: skip
    good = results(tmp_path / "good", "node-a").read_bytes()
    monkeypatch.setattr(sources, "MAX_MEMBER_BYTES", len(good) + 1024)  # "oversized": past it
    tarball = tmp_path / "in.tar.gz"
    tarball.write_bytes(b"\x1f\x8bnot gzip" if kind == "not-a-tarball" else _hostile(kind, good))
    code, fleet = fleet_report(tarball, "--out", tmp_path / "r")
    err = capsys.readouterr().err
    assert code == 2 and fleet is None and not (tmp_path / "r").exists()
    assert err.count("\n") == 1 and err.startswith("hvconform fleet-report: "), err
    assert said in err and str(tarball) in err


def test_two_results_of_one_node_are_refused_naming_both(tmp_path: Path) -> None:
    first = results(tmp_path / "run1" / "a", "node-a")
    second = results(tmp_path / "run2" / "a", "node-a")
    done = hvconform(tmp_path / "run1", tmp_path / "run2", "--out", tmp_path / "r")
    assert done.returncode == 2 and done.stdout == "" and not (tmp_path / "r").exists()
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"two results for node node-a: {first} and {second}" in done.stderr


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("missing-input", "No such file or directory"),
        ("empty-dir", "holds no results.json"),
        ("schema", "does not follow the results schema"),
        ("symlinked-results", "a symlink, not read"),
        ("symlinked-out", "a symlink; give the directory itself"),
        ("out-is-a-file", "exists and is not a directory"),
        ("expect-nodes", "--expect-nodes: a number of nodes"),
        ("nodes-twice", "--nodes: a node is named twice"),
        ("hostile-tarball", "a link (symbolic), refused"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_traceback(
    tmp_path: Path, pool: Path, case: str, said: str
) -> None:
    out = tmp_path / "r"
    args: list[str | Path] = [pool, "--out", out]
    if case == "missing-input":
        args[0] = tmp_path / "nowhere"
    elif case == "empty-dir":
        (tmp_path / "empty").mkdir()
        args[0] = tmp_path / "empty"
    elif case == "schema":
        bad = pool / "node-a" / "results.json"
        bad.write_text(bad.read_text().replace('"status": "passed"', '"status": "great"', 1))
    elif case == "symlinked-results":
        (tmp_path / "links").mkdir()
        (tmp_path / "links" / "results.json").symlink_to(pool / "node-a" / "results.json")
        args[0] = tmp_path / "links"
    elif case == "symlinked-out":
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere")
    elif case == "out-is-a-file":
        out.write_text("a file\n")
    elif case == "expect-nodes":
        args += ["--expect-nodes", "0"]
    elif case == "nodes-twice":
        args += ["--nodes", "node-a,node-a"]
    elif case == "hostile-tarball":
        args[0] = tmp_path / "in.tar.gz"
        (tmp_path / "in.tar.gz").write_bytes(_hostile("symlink", b""))
    done = hvconform(*args)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("hvconform fleet-report: ") and said in done.stderr
    assert not (tmp_path / "elsewhere" / "fleet.json").exists()
    assert out.is_symlink() or out.is_file() or not out.exists()


def test_the_subcommand_runs_from_the_cli_with_its_exit_code(pool: Path, tmp_path: Path) -> None:
    done = hvconform(pool, "--out", tmp_path / "r")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("Pool verdict: FAILED (3 nodes)")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "fleet.html",
        "fleet.json",
        "fleet.txt",
    ]
    helped = hvconform("--help")
    assert helped.returncode == 0 and "--expect-nodes N" in helped.stdout


def test_node_names_are_escaped_in_html(tmp_path: Path) -> None:
    results(tmp_path / "in" / "a", "<b>node</b>")
    code, _ = fleet_report(tmp_path / "in", "--out", tmp_path / "r")
    html = (tmp_path / "r" / "fleet.html").read_text()
    assert code == 0 and "&lt;b&gt;node&lt;/b&gt;" in html and "<b>node</b>" not in html


def test_distribution_rule() -> None:
    values = {f"n{i:02d}": float(i) for i in range(1, 21)}
    d = stats.distribution("c", "f", values)
    assert (d.minimum, d.median, d.p95, d.maximum) == (1.0, 10.5, 19.0, 20.0)  # nearest rank
    assert d.outliers == {}
    # Identical figures (MAD 0): the 5% floor keeps a near value in, a far one out.
    assert stats.outliers({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.04}) == {}
    assert stats.outliers({"a": 1.0, "b": 1.0, "c": 1.0, "d": 2.0}) == {"d": 2.0}
    assert stats.outliers({"a": 0.0, "b": 0.0, "c": 0.0, "d": 1e-3}) == {"d": 1e-3}
    # Two values: neither is more typical than the other.
    assert stats.outliers({"a": 1.0, "b": 1000.0}) == {}
