"""Fuzzing results.json loading and rendering: refused cleanly (ReportError, so exit 2) or
rendered with no live markup in report.md, report.html and junit.xml; never a crash.

Documents are generated to pass the schema (so rendering is reached) with hostile text in every
string and any finite number in every number; raw bytes and mutated files exercise the loader.
"""

from __future__ import annotations

import json
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvconform.report import junit
from hvconform.report.model import build
from hvconform.report.render import ReportError, load_results, render_html, render_markdown
from tests.report.conftest import FIXTURES
from tests.report.hostile import CONTROL, HTML_TAGS, MD_TAGS, PAYLOADS, commonmark, live_markup

SETTINGS = settings(
    database=None,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
STATUSES = ("passed", "failed", "skipped", "not_applicable", "environment_blocked")
VALID = (FIXTURES / "failed-wait-expired.json").read_bytes()

# Any code point, lone surrogates and controls included, plus the known payloads.
texts = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=30),
    st.sampled_from(PAYLOADS),
)
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**63), 2**63),
)
check_ids = st.one_of(st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True), texts)


@st.composite
def checks(draw: st.DrawFn) -> dict[str, Any]:
    status = draw(st.sampled_from(STATUSES))
    reason = draw(texts)
    return {
        "id": draw(check_ids),
        "marker": draw(texts),
        "title": draw(texts),
        "status": status,
        "reason": reason if status == "passed" or reason else "x",
        "duration_s": draw(st.floats(0, 1e300)),
        "metrics": draw(st.dictionaries(texts, st.one_of(numbers, texts), max_size=4)),
        "evidence": draw(st.lists(texts, max_size=3)),
        "timeline": [
            {"name": draw(texts), "t_s": draw(numbers)} for _ in range(draw(st.integers(0, 4)))
        ],
        "notes": draw(st.lists(texts, max_size=2)),
    }


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    run = {
        "id": draw(texts.filter(bool)),
        "target": draw(texts),
        "started_at": draw(texts),
        "finished_at": draw(texts),
        "duration_s": draw(st.floats(0, 1e300)),
        "exit_code": draw(st.integers(-(2**31), 2**31)),
        "markexpr": draw(texts),
        "partial": draw(st.booleans()),
        "interruption": draw(texts),
        "planned": draw(st.lists(texts, max_size=3)),
        "scope_limits": draw(st.lists(texts, max_size=3)),
    }
    environment = draw(st.dictionaries(texts, st.one_of(texts, numbers), max_size=4))
    return {
        "schema_version": "1.0",
        "run": run,
        "environment": environment,
        "checks": draw(st.lists(checks(), max_size=4)),
    }


@pytest.fixture(scope="module")
def run_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hv-fuzz-") as where:
        yield Path(where)


def render_three(path: Path) -> tuple[str, str, str]:
    view = build(load_results(path), path.parent, path.parent)
    return render_markdown(view), render_html(view), junit.render(view)


@SETTINGS
@given(documents())
def test_rendered_or_refused_never_live(run_dir: Path, data: dict[str, Any]) -> None:
    path = run_dir / "results.json"
    path.write_text(json.dumps(data))
    try:
        markdown, html, xml = render_three(path)
    except ReportError as exc:
        assert "\n" not in str(exc)
        return
    for text in (markdown, html, xml):
        assert not CONTROL.search(text.replace("\n", "").replace("\t", ""))
    assert live_markup(commonmark(markdown), MD_TAGS) == []
    assert live_markup(html, HTML_TAGS) == []
    ET.fromstring(xml.encode())  # noqa: S314 (our own junit.xml: it must parse)


def _mutate(data: bytes, edits: list[tuple[int, bytes]]) -> bytes:
    for at, insert in edits:
        at %= len(data) + 1
        data = data[:at] + insert + data[at + len(insert) :]
    return data


@SETTINGS
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(st.tuples(st.integers(0, len(VALID)), st.binary(max_size=8)), max_size=5).map(
            lambda edits: _mutate(VALID, edits)
        ),
        st.integers(1, 5000).map(lambda n: b"[" * n + VALID + b"]" * n),
        st.sampled_from([b'{"a": NaN}', b"[1e400]", b"1" * 5000, b"\xff\xfe{}", b"\x00"]),
    )
)
@example(b"[" * 100_000)
@example(_mutate(VALID, [(294, b" ")]))  # found in CI: a run without markexpr (not required)
def test_loading_any_bytes_is_a_result_or_a_report_error(run_dir: Path, raw: bytes) -> None:
    path = run_dir / "loaded.json"
    path.write_bytes(raw)
    try:
        data = load_results(path)
    except ReportError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    assert isinstance(data, dict) and data["schema_version"] == "1.0"
    render_three(path)  # whatever loads also renders


@SETTINGS
@given(documents(), documents())
def test_compare_of_any_two_documents_is_rendered_or_refused(
    run_dir: Path, a: dict[str, Any], b: dict[str, Any]
) -> None:
    """`hvconform compare A B` over hostile documents (issue 27): one-line refusal (exit 2) or
    both reports rendered with no live markup; never a crash."""
    from hvconform.report.compare import CompareError, compare, load, render_html
    from hvconform.report.compare import render_markdown as compare_markdown

    (run_dir / "a").mkdir(exist_ok=True)
    (run_dir / "b").mkdir(exist_ok=True)
    (run_dir / "a" / "results.json").write_text(json.dumps(a))
    (run_dir / "b" / "results.json").write_text(json.dumps(b))
    try:
        view = compare(load(str(run_dir / "a")), load(str(run_dir / "b")), run_dir)
    except (CompareError, ReportError) as exc:
        assert "\n" not in str(exc)
        return
    markdown, html = compare_markdown(view), render_html(view)
    for text in (markdown, html):
        assert not CONTROL.search(text.replace("\n", "").replace("\t", ""))
    assert live_markup(commonmark(markdown), MD_TAGS) == []
    assert live_markup(html, HTML_TAGS) == []
