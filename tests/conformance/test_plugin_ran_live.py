"""The local target records what really ran as the plugin (live: real sandboxed processes).

`hvconform run` reads the plugin's argv and executable back from /proc once its node is up and
once at the end; results.json holds them (run.plugin_ran), plugin-identity passes only because
they are the profile's, and the report names that process: this repository's version only for
this repository's plugin, never next to a third party's command line. One check per run keeps
each run to a few seconds.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from hv_device_plugin.api.names import installed_version
from hvconform.contract.results import validate_results
from tests.fixture_plugins import GO_KVM_DIR, build_go_kvm

ROOT = Path(__file__).resolve().parents[2]
HEALTH_ADDR = re.compile(r"10\.231\.\d+\.2:8080")


def run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--out", str(out),
         "--reports-root", str(tmp_path), *args, "--", "-k", "cdi-missing"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    validate_results(data)
    return data, (out / "report.md").read_text()


def reads(data: dict[str, Any]) -> list[dict[str, Any]]:
    ran: list[dict[str, Any]] = data["run"]["plugin_ran"]
    assert [(r["worker"], r["phase"], r["how"]) for r in ran] == [
        ("main", "setup", "process"),
        ("main", "end", "process"),
    ], ran
    assert ran[0]["pid"] > 0 and ran[0]["argv"] == ran[1]["argv"]
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["plugin-identity"]["status"] == "passed", by_id["plugin-identity"]
    assert by_id["plugin-identity"]["metrics"] == {"nodes": 1, "read_backs": 2}
    return ran


def environment(report: str) -> str:
    return report.split("## Environment\n", 1)[1].split("\n## ", 1)[0]


def test_our_plugins_argv_is_read_back_from_its_process(tmp_path: Path) -> None:
    data, report = run(tmp_path)
    ran = reads(data)
    argv = ran[0]["argv"]
    # The shipped profile's command as the target filled it: the health address is its own.
    assert argv[:-1] == [sys.executable, "-m", "hv_device_plugin", "--host-dev-dir", "/host-dev",
                         "--health-addr"], argv  # fmt: skip
    assert HEALTH_ADDR.fullmatch(argv[-1]), argv
    assert Path(ran[0]["exe"]).resolve() == Path(sys.executable).resolve()
    assert data["run"]["plugin"]["this_repository"] is True
    assert data["environment"]["plugin_version"] == installed_version()
    env = environment(report)
    assert f"- Plugin: hv-device-plugin {installed_version()} (this repository's plugin)" in env
    quoted = shlex.join([sys.executable, "-m", "hv_device_plugin", "--host-dev-dir"])
    assert f"- Plugin ran: process {quoted}" in env


def test_a_third_party_plugin_is_named_by_its_process_not_our_version(tmp_path: Path) -> None:
    binary = build_go_kvm()
    data, report = run(tmp_path, "--plugin-profile", str(GO_KVM_DIR / "profile.yaml"))
    ran = reads(data)
    assert ran[0]["argv"] == [str(binary), "-v=2"], ran[0]
    assert Path(ran[0]["exe"]).name == binary.name
    assert data["run"]["plugin"]["this_repository"] is False
    assert data["environment"]["plugin_version"].startswith("unknown: not this repository's")
    env = environment(report)
    assert f"version {installed_version()}" not in env and "this repository's plugin)" not in env
    assert "- Plugin: go-kvm, profile " in env
    assert f"- Plugin ran: process {shlex.join([str(binary), '-v=2'])} (executable " in env
