"""render_all and the step summary: files, relative links, partial runs, shipped templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hvconform.report import append_step_summary, render_all
from hvconform.report.render import STEP_SUMMARY_LIMIT, environment
from tests.report.conftest import ROOT, make_run


def test_render_all_writes_every_report(run_results: Path) -> None:
    files = render_all(run_results, run_results.parent)
    assert set(files) == {"markdown", "html", "junit", "evidence"}
    for path in files.values():
        assert path.parent == run_results.parent and path.stat().st_size > 0
    assert not list(run_results.parent.glob("*.tmp"))


def test_links_are_relative_to_the_report_dir(tmp_path: Path) -> None:
    results = make_run(tmp_path, "failed-wait-expired")
    out = tmp_path / "published"
    files = render_all(results, out)
    text = files["markdown"].read_text()
    assert "(../run-failed-wait-expired/evidence/cdi-missing-plugin.log)" in text
    assert "[plugin-main.log](../run-failed-wait-expired/plugin-main.log)" in text
    assert 'href="../run-failed-wait-expired/results.json"' in files["html"].read_text()


def test_partial_runs_are_reported_as_incomplete(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    files = render_all(results, results.parent, partial=True)
    assert "**Verdict: INCOMPLETE.**" in files["markdown"].read_text()
    assert 'class="verdict incomplete"' in files["html"].read_text()


def test_step_summary_is_appended_only_when_set(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    md = render_all(results, results.parent)["markdown"]
    assert append_step_summary(md, {}) is None
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    assert append_step_summary(md, {"GITHUB_STEP_SUMMARY": str(summary)}) == summary
    text = summary.read_text()
    assert text.startswith("earlier step\n# hvconform validation: local target")


def test_step_summary_stays_under_githubs_limit(tmp_path: Path) -> None:
    big = tmp_path / "report.md"
    big.write_text("x" * (2 * STEP_SUMMARY_LIMIT))
    summary = tmp_path / "summary.md"
    append_step_summary(big, {"GITHUB_STEP_SUMMARY": str(summary)})
    assert len(summary.read_bytes()) < STEP_SUMMARY_LIMIT
    assert "truncated" in summary.read_text()


def test_templates_ship_in_the_package_and_reports_templates_points_at_them() -> None:
    package_dir = ROOT / "conformance" / "report" / "templates"
    names = sorted(environment().list_templates())
    assert names == [
        *("compare.css.j2", "compare.html.j2", "compare.md.j2"),
        *("report.css.j2", "report.html.j2", "report.md.j2"),
    ]
    assert sorted(p.name for p in package_dir.glob("*.j2")) == names
    assert (ROOT / "reports" / "templates").resolve() == package_dir


def test_unknown_fields_fail_the_render(tmp_path: Path) -> None:
    # StrictUndefined: a template that names a field the view lacks must fail, not print "".
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        environment().from_string("{{ r.no_such_field }}").render(r=json.loads("{}"))
