"""Every fixture under fixtures/metadata through the Python API and the CLI, and rule mutants."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hvconform.metadata import cli as metadata_cli
from hvconform.metadata import rules as metadata
from hvconform.metadata.rules import Context, MetadataInputError, Snapshot, Verdict, Violation

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "metadata"
CASES = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}
CASE_KEYS = {"description", "phase", "original", "current", "expect", "message"}
OPTIONAL_KEYS = {"validated", "lookup", "node_kvm_gid"}


def snapshot_text(value: object) -> str:
    """A fixture snapshot as file text: a string is raw (malformed on purpose), else JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def lookup_path(case: dict[str, Any], tmp: Path) -> Path:
    """The lookup as a file; a failed lookup (null) is a file that was never written."""
    path = tmp / "lookup.txt"
    if case["lookup"] is not None:
        path.write_text(case["lookup"])
    return path


def api_verdict(case: dict[str, Any], tmp: Path) -> Verdict:
    phase = case["phase"]
    try:
        original = metadata.parse_snapshot_text(
            snapshot_text(case["original"]), "original snapshot"
        )
        current = metadata.parse_snapshot_text(snapshot_text(case["current"]), "current snapshot")
        validated = (
            metadata.parse_snapshot_text(snapshot_text(case["validated"]), "validated snapshot")
            if "validated" in case
            else None
        )
        if phase == "final":
            return metadata.check_final(original, validated, current)
        if "node_kvm_gid" in case:
            gid = metadata.checked_node_gid(case["node_kvm_gid"])
        else:
            gid = metadata.read_group_lookup(lookup_path(case, tmp))
    except MetadataInputError as exc:
        return metadata.error_verdict(phase, str(exc))
    return metadata.check_startup(original, current, gid)


def cli_argv(case: dict[str, Any], tmp: Path) -> list[str]:
    files = {}
    for name in ("original", "current", "validated"):
        if name in case:
            files[name] = tmp / f"{name}.json"
            files[name].write_text(snapshot_text(case[name]))
    argv = ["metadata", f"check-{case['phase']}"]
    argv += [arg for name, path in files.items() for arg in (f"--{name}", str(path))]
    if "node_kvm_gid" in case:
        argv += ["--node-kvm-gid", str(case["node_kvm_gid"])]
    elif case["phase"] == "startup":
        argv += ["--group-lookup", str(lookup_path(case, tmp))]
    return argv


def test_enough_well_formed_fixtures() -> None:
    assert len(CASES) >= 24
    for name, case in CASES.items():
        assert CASE_KEYS <= set(case) <= CASE_KEYS | OPTIONAL_KEYS, name
        assert case["phase"] in ("startup", "final"), name
        assert case["expect"] in ("accepted", "rejected", "error"), name
        assert name.startswith(case["phase"]), name
        if case["phase"] == "startup":
            assert ("lookup" in case) != ("node_kvm_gid" in case), name
    expects = {(c["phase"], c["expect"]) for c in CASES.values()}
    assert expects == {
        (p, e) for p in ("startup", "final") for e in ("accepted", "rejected", "error")
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_through_api(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    verdict = api_verdict(case, tmp_path)
    assert verdict.status == case["expect"], verdict.message
    assert case["message"] in verdict.message
    assert "\n" not in verdict.message
    assert verdict.exit_code == {"accepted": 0, "rejected": 1, "error": 2}[case["expect"]]
    if verdict.status == "rejected":
        assert verdict.violations and "; rule: " in verdict.message


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_through_cli(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name]
    code = metadata_cli.main_for_tests(cli_argv(case, tmp_path))
    out, err = capsys.readouterr()
    assert code == {"accepted": 0, "rejected": 1, "error": 2}[case["expect"]], out + err
    # One line, on stdout for a verdict and on stderr for unusable input.
    line = err if case["expect"] == "error" else out
    assert (out if case["expect"] == "error" else err) == ""
    assert line.endswith("\n") and line.count("\n") == 1, line
    assert line.startswith(f"{case['expect']}: ") and case["message"] in line, line
    if code != 2:  # error lines name the temp files, verdicts do not
        (tmp_path / "api").mkdir()
        assert line.rstrip("\n") == api_verdict(case, tmp_path / "api").message


def lenient_gid(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    return []


def strict_gid(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    return metadata.rule_exact_gid(ref, cur, ctx)


def block_is_char(ref: Snapshot, cur: Snapshot, ctx: Context) -> list[Violation]:
    kinds = {"char", "block"}
    return [] if {ref.kind, cur.kind} <= kinds else [Violation("type", "type", "altered")]


MUTANTS: dict[str, tuple[str, Callable[..., Any]]] = {
    "no-present-rule": ("rule_present", lambda *a: []),
    "no-character-rule": ("rule_character", lambda *a: []),
    "block-counts-as-char": ("rule_character", block_is_char),
    "no-device-numbers-rule": ("rule_device_numbers", lambda *a: []),
    "only-major-checked": (
        "rule_device_numbers",
        lambda r, c, x: metadata._changed(r, c, "major", x.rule),
    ),
    "no-owner-rule": ("rule_owner", lambda *a: []),
    "no-mode-rule": ("rule_mode", lambda *a: []),
    "any-gid-at-startup": ("rule_startup_gid", lenient_gid),
    "no-gid-change-at-startup": ("rule_startup_gid", strict_gid),
    "no-gid-rule-at-final": ("rule_exact_gid", lambda *a: []),
    "final-always-original": ("final_reference", lambda o, v: (o, "original")),
    "final-always-validated": ("final_reference", lambda o, v: (v or o, "validated")),
    "validated-never-checked": ("validated_mismatch", lambda o, v: ""),
    "lookup-trusted-blindly": ("parse_group_lookup", lambda text, group="kvm": 993),
    "node-gid-unchecked": ("checked_node_gid", lambda v: int(v) if str(v).isdigit() else 993),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_rule_mutant_fails_a_fixture(
    mutant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, replacement = MUTANTS[mutant]
    assert callable(getattr(metadata, name))
    monkeypatch.setattr(metadata, name, replacement)
    failed = []
    for case_name, case in CASES.items():
        work = tmp_path / case_name
        work.mkdir()
        try:
            verdict = api_verdict(case, work)
        except Exception as exc:  # a mutant may crash: that is a caught mutant too
            failed.append(f"{case_name}: {exc!r}")
            continue
        if verdict.status != case["expect"] or case["message"] not in verdict.message:
            failed.append(case_name)
    assert failed, f"mutant {mutant} ({name}) survived every fixture"


def test_cli_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = tmp_path / "s.json"
    snap.write_text(metadata.dump_snapshot(metadata.snapshot("/dev/kvm")))
    lookup = tmp_path / "l.txt"
    lookup.write_text("kvm:x:993:\n")
    s, lk = str(snap), str(lookup)
    bad = [
        ["check-startup", "--original", s, "--current", s],  # no node kvm group given
        [
            "check-startup",
            "--original",
            s,
            "--current",
            s,
            "--node-kvm-gid",
            "1",
            "--group-lookup",
            lk,
        ],
        ["check-final", "--current", s],
        ["check-final", "--original", str(tmp_path / "absent.json"), "--current", s],
        ["check-final", "--original", str(tmp_path), "--current", s],  # a directory
        ["snapshot", "--device", "dev/kvm", "--out", str(tmp_path / "x.json")],
        ["snapshot", "--out", str(tmp_path / "no-such-dir" / "x.json")],
        ["nonsense"],
    ]
    for argv in bad:
        assert metadata_cli.main_for_tests(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err, argv


def test_snapshot_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kvm.json"
    assert metadata_cli.main_for_tests(["snapshot", "--out", str(out)]) == 0
    snap = metadata.load_snapshot(out)
    assert (snap.kind, snap.major, snap.minor) == ("char", 10, 232)
    assert snap == metadata.snapshot("/dev/kvm")
    gone = tmp_path / "gone"
    assert metadata_cli.main_for_tests(["snapshot", "--device", str(gone), "--out", "-"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["type"] == "missing" and printed["path"] == str(gone)


def test_group_lookup_from_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES["startup-gid-to-node-kvm-993"]
    argv = [*cli_argv(case, tmp_path)[:-2], "--group-lookup", "-"]
    for text, code in (("kvm:x:993:\n", 0), ("", 2), ("kvm:x:994:\n", 1)):
        monkeypatch.setattr(sys, "stdin", io.StringIO(text))
        assert metadata_cli.main_for_tests(argv) == code
        capsys.readouterr()


@pytest.mark.parametrize("entry", ["hvconform.metadata.cli", "hvconform.cli"])
def test_cli_as_a_process(entry: str, tmp_path: Path) -> None:
    """`python -m`: hvconform.cli needs the lead's `register` line in cli_parser._subcommands()."""
    case = CASES["startup-mode-changed"]
    argv = [sys.executable, "-m", entry, *cli_argv(case, tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == (
        "rejected: mode changed 0660 -> 0666 at startup; "
        "rule: startup may change only the gid, and only to the node's kvm group\n"
    )
