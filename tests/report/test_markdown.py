"""report.md from the fixed fixtures: golden files, and the promises the report makes a reader.

Regenerate the golden files only on purpose: HV_UPDATE_GOLDEN=1 pytest tests/report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hvconform.report.model import build
from hvconform.report.render import ReportError, load_results, render_markdown
from tests.report.conftest import FIXTURES, GOLDEN, NAMES


def markdown(name: str, *, partial: bool = False) -> str:
    path = FIXTURES / f"{name}.json"
    return render_markdown(build(load_results(path), path.parent, path.parent, partial=partial))


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_kind_of_run_has_a_fixture() -> None:
    assert NAMES == [
        "all-passed",
        "failed-wait-expired",
        "mixed-not-verified",
        "partial-interrupted",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_markdown_matches_golden(name: str) -> None:
    text = markdown(name)
    golden = GOLDEN / f"{name}.md"
    if os.environ.get("HV_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with HV_UPDATE_GOLDEN=1 once, then review it"
    assert text == golden.read_text(), f"{name}: report.md changed; review, then HV_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", NAMES)
def test_one_row_per_check_and_every_non_pass_is_a_scope_limit(name: str) -> None:
    """Every check that did not pass is said once more: a failure under its heading
    (failures or SHOULD), anything else that verified nothing as a scope limit."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    text = markdown(name)
    table = section(text, "Results")
    limits = section(text, "Scope limits")
    for check in data["checks"]:
        assert table.count(f"(`{check['id']}`) |") == 1, check["id"]
        if check["status"] == "failed":
            assert f"### `{check['id']}`:" in text, f"{check['id']} not under Failures"
            assert f"`{check['id']}`" not in limits, f"{check['id']} repeated as a scope limit"
        elif check["status"] != "passed":
            assert f"`{check['id']}`" in limits, f"{check['id']} ({check['status']}) not a limit"
    for planned in data["run"].get("planned", []):
        assert f"`{planned}`" in table


def test_seed_style_figures_in_words() -> None:
    table = section(markdown("all-passed"), "Results")
    assert "Recovered in 3.1 ms; ready again 4.8 ms after the fault" in table
    assert "re-registered in 10 ms after a crash restart" in table
    assert "56,351 reads, 0 torn, 0 errors" in table
    assert "a fresh guest passed after each of 2 faults" in table


def test_a_failed_check_names_the_expired_wait_and_its_evidence() -> None:
    failures = section(markdown("failed-wait-expired"), "Failures")
    assert "The wait that expired: **CDI spec byte-exact again (missing spec)**, after 30 s" in (
        failures
    )
    assert "[cdi-missing-plugin.log](evidence/cdi-missing-plugin.log)." in failures
    # The atomic-replacement evidence was never written: the report says so instead of linking.
    assert "atomic-replacement-plugin.log) (not found next to results.json)" in failures
    assert "The assertion that failed: 3 torn or foreign reads" in failures


def test_verdicts() -> None:
    assert "**Verdict: PASSED.**" in markdown("all-passed")
    assert "**Verdict: FAILED.**" in markdown("failed-wait-expired")
    assert "**Verdict: FAILED.**" in markdown("partial-interrupted")  # cleanup failed too
    forced = markdown("all-passed", partial=True)
    assert "**Verdict: INCOMPLETE.**" in forced
    assert "> **Partial run.**" in forced


def test_environment_names_runtime_images_and_node() -> None:
    env = section(markdown("mixed-not-verified"), "Environment")
    assert "- Container runtime: containerd 2.3.3-2" in env
    assert "- Node SKU: Standard_D4ads_v5" in env
    assert "- Kubernetes: 1.35.7" in env
    assert (
        "hv-device-plugin@sha256:b89483a3ed73853afb7f5070d1b53e2c9a8d6f77b1e1ff1ce04cfdc602ada9a1"
        in env
    )


def test_table_cells_cannot_break_the_table(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "failed-wait-expired.json").read_text())
    data["checks"][1]["reason"] = "AssertionError: a | b\nsecond line <script>x</script>"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    text = render_markdown(build(load_results(path), tmp_path, tmp_path))
    row = next(line for line in text.splitlines() if line.startswith("| Missing CDI"))
    assert row.count(" | ") == 1 and "A \\| b second line &lt;script&gt;" in row


def test_results_that_break_the_schema_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema_version": "1.0", "run": {}, "environment": {}}))
    with pytest.raises(ReportError, match="does not follow the results schema"):
        load_results(path)
    path.write_text("{not json")
    with pytest.raises(ReportError, match="not JSON"):
        load_results(path)
    with pytest.raises(ReportError, match="No such file"):
        load_results(tmp_path / "absent.json")
