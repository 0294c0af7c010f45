"""evidence.tar.gz: everything of the run, deterministic, checksummed, no symlink followed."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

from hvconform.report import render_all
from hvconform.report.evidence import bundle, mtime_of
from tests.report.conftest import make_run


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        found = {}
        for info in tar.getmembers():
            handle = tar.extractfile(info)
            assert handle is not None and info.isfile(), info.name
            assert (info.uid, info.gid, info.mode) == (0, 0, 0o644)
            found[info.name] = handle.read()
        return found


def test_bundle_holds_the_run_and_its_reports(tmp_path: Path) -> None:
    results = make_run(tmp_path, "failed-wait-expired")
    (results.parent / "metadata").mkdir()
    (results.parent / "metadata" / "main.json").write_text("{}\n")
    files = render_all(results, results.parent)
    found = members(files["evidence"])
    prefix = "hvconform-20261202T170501Z-20811/"
    names = [n.removeprefix(prefix) for n in found]
    assert names[0] == "SHA256SUMS"
    assert names[1:] == sorted(names[1:])
    for expected in (
        "results.json",
        "plugin-main.log",
        "ledger/main.jsonl",
        "evidence/cdi-missing-plugin.log",
        "metadata/main.json",
        "report.md",
        "report.html",
        "junit.xml",
    ):
        assert expected in names
    assert "evidence.tar.gz" not in names
    sums = found[prefix + "SHA256SUMS"].decode().splitlines()
    assert len(sums) == len(found) - 1
    for line in sums:
        digest, rel = line.split("  ", 1)
        assert hashlib.sha256(found[prefix + rel]).hexdigest() == digest


def test_reports_rendered_elsewhere_travel_in_the_bundle(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    files = render_all(results, tmp_path / "published")
    names = {n.split("/", 1)[1] for n in members(files["evidence"])}
    assert {"report/report.md", "report/report.html", "report/junit.xml"} <= names
    assert "results.json" in names


def test_bundle_is_deterministic(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    run = results.parent
    first = bundle(run, tmp_path / "one.tar.gz", "r1", "2026-12-02T16:21:57Z").read_bytes()
    for path in run.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))  # new times on disk must not change the bytes
    second = bundle(run, tmp_path / "two.tar.gz", "r1", "2026-12-02T16:21:57Z").read_bytes()
    assert first == second
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        assert {m.mtime for m in tar.getmembers()} == {mtime_of("2026-12-02T16:21:57Z")}


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    secret = tmp_path / "outside.txt"
    secret.write_text("host secret\n")
    (results.parent / "evidence" / "planted.log").symlink_to(secret)
    (results.parent / "linked-dir").symlink_to(tmp_path)
    found = members(bundle(results.parent, tmp_path / "b.tar.gz", "r", ""))
    assert not any("planted" in n or "linked-dir" in n for n in found)
    assert all(b"host secret" not in data for data in found.values())


def test_mtime_of_reads_utc_stamps() -> None:
    assert mtime_of("1970-01-01T00:01:00Z") == 60
    assert mtime_of("yesterday") == 0
