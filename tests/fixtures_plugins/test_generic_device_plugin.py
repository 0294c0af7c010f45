"""A public plugin this repository did not write, judged by the whole catalogue on the local target.

squat/generic-device-plugin, pinned (tests.fixture_plugins.GENERIC_VERSION) and built from the Go
module proxy, runs unmodified from fixtures/plugins/generic-device-plugin/profile.yaml. Its
verdict for every check is documented, each justified from its code, in that fixture's README
(and summed up in the repository README's "A public plugin's verdicts"): a fresh run must give
exactly those verdicts, and the checks that once changed verdict between the whole run and a run
of their own (issue 35) must give the same verdict alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.test_hvconform import hvconform, statuses
from tests.fixture_plugins import GENERIC_DIR, REPO, build_generic_device_plugin

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]

PROFILE = GENERIC_DIR / "profile.yaml"
VERDICTS = {"passed", "failed", "not_applicable", "blocked"}
# A documented row of the fixture's README: | `check-id` | verdict | why |.
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| (\w+) \|", re.MULTILINE)


def documented(readme: Path, heading: str) -> dict[str, str]:
    """The verdict table under `heading` (up to the next heading) of a README."""
    text = readme.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    table = dict(ROW.findall(text[start : end if end > 0 else len(text)]))
    assert table and set(table.values()) <= VERDICTS, table
    return table


def _run(tmp_path: Path, *pytest_args: str) -> tuple[int, dict[str, Any], str]:
    build_generic_device_plugin()
    args = ["--", *pytest_args] if pytest_args else []
    return hvconform(tmp_path, "--plugin-profile", str(PROFILE), *args)


def summed_up() -> dict[str, str]:
    """The repository README's summary: | verdict | `check`, `check` ... |, one row a verdict."""
    text = (REPO / "README.md").read_text()
    start = text.index("### A public plugin's verdicts")
    section = text[start : text.index("\n#", start + 1)]
    rows = re.findall(r"^\| (\w+) \| (`.*`) \|$", section, re.MULTILINE)
    return {c: verdict for verdict, checks in rows for c in re.findall(r"`([a-z0-9-]+)`", checks)}


def test_both_readmes_document_the_same_verdicts() -> None:
    fixture = documented(GENERIC_DIR / "README.md", "## Verdicts on the local target")
    assert summed_up() == fixture


@pytest.mark.timeout(900)
def test_the_whole_catalogue_gives_the_documented_verdicts(tmp_path: Path) -> None:
    want = documented(GENERIC_DIR / "README.md", "## Verdicts on the local target")
    code, data, output = _run(tmp_path)
    got = statuses(data)
    reasons = {c["id"]: c.get("reason", "") for c in data.get("checks", [])}
    diff = {c: (got.get(c), want.get(c), reasons.get(c, "")[:300]) for c in {*got, *want}
            if got.get(c) != want.get(c)}  # fmt: skip
    assert not diff, f"{diff}\n{output[-3000:]}"
    assert code == 1  # it fails checks: the run says so
    assert data["run"]["plugin"]["name"] == "generic-device-plugin"
    print("generic-device-plugin whole run:", data["run"]["duration_s"], "s")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("check", ["guest-execution", "node-reboot"])
def test_a_check_alone_gives_its_whole_run_verdict(tmp_path: Path, check: str) -> None:
    """Issue 35: guest-execution and node-reboot failed in the whole run on a device map an
    earlier check had emptied; alone they are judged on the plugin's own behaviour."""
    want = documented(GENERIC_DIR / "README.md", "## Verdicts on the local target")[check]
    _, data, output = _run(tmp_path, "-k", check)
    by_id = {c["id"]: c for c in data.get("checks", [])}
    assert by_id[check]["status"] == want, f"{by_id[check].get('reason')}\n{output[-3000:]}"
    assert "requested device does not exist" not in by_id[check].get("reason", "")
