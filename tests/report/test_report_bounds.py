"""`hvconform report` bounds its work and its output as `compare` does (issue 34, item 4): a
results file past the caps is refused with one line before any work, one within them shows at
most the caps' figures and events and says what it left out; results.json is read strictly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.report import junit
from hvconform.report.model import MAX_EVENTS_PER_CHECK, MAX_FIGURES_PER_CHECK, build
from hvconform.report.render import (
    MAX_RESULTS_BYTES,
    MAX_RESULTS_VALUES,
    ReportError,
    load_results,
    render_html,
    render_markdown,
)
from tests.report.conftest import FIXTURES

HVCONFORM = [sys.executable, "-m", "hvconform.cli"]
OUTPUTS = ("report.md", "report.html", "junit.xml", "evidence.tar.gz")


def results(tmp_path: Path, metrics: int, events: int = 0) -> Path:
    """A run directory whose first failed check records `metrics` metrics and `events` events."""
    data: dict[str, Any] = json.loads((FIXTURES / "failed-wait-expired.json").read_text())
    failed = next(c for c in data["checks"] if c["status"] == "failed")
    failed["metrics"] = {f"m{i}_s": i / 1000 for i in range(metrics)}
    if events:
        failed["timeline"] = [{"name": f"event {i}", "t_s": i / 10} for i in range(events)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(data))
    return run / "results.json"


def report(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HVCONFORM, "report", str(path)], capture_output=True, text=True, timeout=300
    )


def test_two_million_metrics_are_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    path = results(tmp_path, 2_000_000)
    assert path.stat().st_size > MAX_RESULTS_BYTES
    proc = report(path)
    assert proc.returncode == 2, proc.stdout
    (line,) = proc.stderr.splitlines()
    assert f"more than {MAX_RESULTS_BYTES}" in line
    assert not any((path.parent / name).exists() for name in OUTPUTS)


def test_more_values_than_the_cap_are_refused_before_the_schema(tmp_path: Path) -> None:
    path = results(tmp_path, MAX_RESULTS_VALUES + 1)
    assert path.stat().st_size < MAX_RESULTS_BYTES, "refused for its values, not its bytes"
    with pytest.raises(ReportError, match=f"more than {MAX_RESULTS_VALUES} values"):
        load_results(path)


def test_within_the_caps_the_outputs_are_bounded_and_say_what_they_left_out(
    tmp_path: Path,
) -> None:
    metrics = MAX_RESULTS_VALUES - 2_000
    path = results(tmp_path, metrics, events=300)
    proc = report(path)
    assert proc.returncode == 1, proc.stderr  # the fixture has a failed check
    sizes = {name: (path.parent / name).stat().st_size for name in OUTPUTS[:3]}
    assert all(size < 256 * 1024 for size in sizes.values()), sizes
    markdown = (path.parent / "report.md").read_text()
    hidden = metrics - MAX_FIGURES_PER_CHECK
    assert f"{hidden} more figures not shown (at most {MAX_FIGURES_PER_CHECK} per check" in markdown
    assert f"{300 - MAX_EVENTS_PER_CHECK} more timeline events" in markdown
    assert f"{300 - MAX_EVENTS_PER_CHECK} later events are in results.json" in markdown
    assert "event 63 at" in markdown and "event 64 at" not in markdown
    html = (path.parent / "report.html").read_text()
    assert f"{hidden} more figures not shown; results.json holds every one" in html
    assert html.count("<td><code>m") == MAX_FIGURES_PER_CHECK
    xml = (path.parent / "junit.xml").read_text()
    assert f"not shown: {hidden} more figures, {300 - MAX_EVENTS_PER_CHECK} more events" in xml


def test_a_report_within_the_caps_left_nothing_out(tmp_path: Path) -> None:
    path = results(tmp_path, MAX_FIGURES_PER_CHECK, events=MAX_EVENTS_PER_CHECK)
    view = build(load_results(path), path.parent, path.parent)
    assert view.left_out == ""
    for text in (render_markdown(view), render_html(view), junit.render(view)):
        assert "not shown" not in text and "later events" not in text
    assert f"m{MAX_FIGURES_PER_CHECK - 1}_s" in render_html(view)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t.replace('"schema_version"', '"schema_version": "1.0", "schema_version"', 1),
         "duplicate key 'schema_version'"),
        (lambda t: t.replace('"exit_code": 1', '"exit_code": 1' + "0" * 100_000, 1),
         "an integer of more than 18 digits"),
    ],
)  # fmt: skip
def test_results_are_read_by_the_strict_loader(tmp_path: Path, edit: Any, needle: str) -> None:
    path = results(tmp_path, 1)
    text = path.read_text()
    changed = edit(text)
    assert changed != text
    path.write_text(changed)
    with pytest.raises(ReportError, match=needle) as refused:
        load_results(path)
    assert "\n" not in str(refused.value)
