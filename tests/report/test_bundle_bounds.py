"""evidence.tar.gz takes only what the run wrote, never through a symlink, streamed and capped.

The careless case of issue 16: a private key and a 300 MB file next to results.json. Rendered by
`hvconform report` in a child process whose peak RSS is read from wait4(), so the figure is that
process's own, not the test runner's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hvconform.contract import manifest
from hvconform.report import evidence, render_all
from tests.report.conftest import make_run

ROOT = Path(__file__).resolve().parents[2]
BIG = 300 * 1024 * 1024
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAAfakefakefake\n"
# Peak RSS of `hvconform report` (Python, jinja2, jsonschema loaded) stays far below the big
# file; reading it whole, as the old bundle did, took 357 MB.
RSS_LIMIT_MIB = 150


def members(path: Path) -> dict[str, int]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: m.size for m in tar.getmembers()}


def careless_neighbours(run: Path) -> None:
    """What a careless --out leaves next to the results: a key, a hidden dir, a big file."""
    (run / ".ssh").mkdir()
    (run / ".ssh" / "id_ed25519").write_text(KEY)
    (run / "id_rsa").write_text(KEY)
    with (run / "big.bin").open("wb") as sparse:
        sparse.truncate(BIG)  # sparse: 300 MB to read, nothing on disk


# ru_maxrss counts a child from fork, before exec: forked from a large test worker it would report
# the worker's size. So a fresh, small interpreter starts the report and reads its peak instead.
_MEASURE = (
    "import os, subprocess, sys\n"
    "proc = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "print(f'PEAK_RSS_KIB={usage.ru_maxrss}')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def report_in_child(results: Path) -> tuple[int, str, float]:
    """Exit code, output and peak RSS (MiB) of `hvconform report RESULTS` in its own process."""
    cmd = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "hvconform.cli", "report"]
    proc = subprocess.run(
        [*cmd, str(results)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    lines = proc.stdout.splitlines()
    peak = [ln for ln in lines if ln.startswith("PEAK_RSS_KIB=")]
    assert peak, proc.stdout + proc.stderr
    output = "\n".join(ln for ln in lines if ln not in peak) + proc.stderr
    return proc.returncode, output, int(peak[-1].split("=", 1)[1]) / 1024


@pytest.mark.parametrize("kept", ["manifest", "layout"])
def test_a_key_and_a_big_file_next_to_the_results_are_never_bundled(
    tmp_path: Path, kept: str, record_property: pytest.RecordProperty
) -> None:
    results = make_run(tmp_path, "all-passed")
    run = results.parent
    if kept == "manifest":  # as `hvconform run` leaves it: the run's files, then the careless ones
        manifest.write(run, manifest.inventory(run))
    careless_neighbours(run)
    code, output, rss = report_in_child(results)
    record_property("peak_rss_mib", round(rss, 1))
    print(f"peak RSS of hvconform report ({kept}): {rss:.1f} MiB")
    assert code == 0, output
    found = members(run / "evidence.tar.gz")
    assert not any("id_" in n or ".ssh" in n or "big.bin" in n for n in found), sorted(found)
    assert {"results.json", "plugin-main.log", "ledger/main.jsonl", "report.md"} <= set(found)
    with tarfile.open(run / "evidence.tar.gz") as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            assert handle is not None and b"PRIVATE KEY" not in handle.read()
    assert rss < RSS_LIMIT_MIB


def test_a_listed_file_over_the_cap_is_left_out_and_named(
    tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    results = make_run(tmp_path, "all-passed")
    run = results.parent
    with (run / "evidence" / "huge.log").open("wb") as sparse:
        sparse.truncate(BIG)
    # Under the cap, a large file is bundled, streamed: memory does not grow with it.
    with (run / "evidence" / "large.log").open("wb") as sparse:
        sparse.truncate(evidence.MAX_FILE_BYTES - 1)
    manifest.write(run, manifest.inventory(run))
    code, output, rss = report_in_child(results)
    record_property("peak_rss_mib", round(rss, 1))
    print(f"peak RSS with a {evidence.MAX_FILE_BYTES - 1} byte member streamed: {rss:.1f} MiB")
    assert code == 0, output
    found = members(run / "evidence.tar.gz")
    assert "evidence/huge.log" not in found
    assert found["evidence/large.log"] == evidence.MAX_FILE_BYTES - 1
    text = (run / "report.md").read_text()
    assert "Left out: evidence/huge.log: 300.0 MiB, larger than the 64.0 MiB cap per file" in text
    assert "Left out: evidence/huge.log" in (run / "report.html").read_text()
    assert rss < RSS_LIMIT_MIB


def test_a_manifest_cannot_reach_outside_the_run(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    run = results.parent
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    (run / "evidence" / "linked").symlink_to(tmp_path)
    (run / "evidence" / "file-link.log").symlink_to(secret)
    (run / "kubeconfig-hv").write_text("apiVersion: v1\n")
    os.mkfifo(run / "fifo")
    listed = [
        "results.json",
        "../secret.txt",
        "/etc/passwd",
        "evidence/linked/secret.txt",
        "evidence/file-link.log",
        ".ssh/id_ed25519",
        "kubeconfig-hv",
        "fifo",
    ]
    (run / manifest.NAME).write_text(json.dumps({"schema": manifest.SCHEMA, "files": listed}))
    files = render_all(results, run)
    found = members(files["evidence"])
    assert set(found) == {"SHA256SUMS", "results.json", "report.md", "report.html", "junit.xml"}
    text = files["markdown"].read_text()
    for name, why in (
        ("../secret.txt", "outside the run directory"),
        ("/etc/passwd", "not a relative path"),
        ("evidence/linked/secret.txt", "a symlink, not followed"),
        ("evidence/file-link.log", "a symlink, not followed"),
        (".ssh/id_ed25519", "a hidden name"),
        ("kubeconfig-hv", "a credential by its name; never bundled"),
        ("fifo", "not a regular file"),
    ):
        assert f"Left out: {name}: {why}" in text, name


@pytest.mark.parametrize(
    "content",
    ["[" * 100_000, '{"schema": "hvconform-manifest/1", "files": "x"}', "\x00\x01binary"],
    ids=["deep", "not-a-list", "binary"],
)
def test_a_broken_manifest_refuses_the_report(tmp_path: Path, content: str) -> None:
    results = make_run(tmp_path, "all-passed")
    (results.parent / manifest.NAME).write_text(content)
    code, output, _ = report_in_child(results)
    assert code == 2 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert "manifest" in output
