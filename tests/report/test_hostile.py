"""A crafted results.json: report.md, report.html and junit.xml carry its text, never its markup.

report.md is rendered by markdown-it-py (CommonMark, raw HTML on, every link accepted) and both
HTML documents are loaded in a real headless Chromium without the report's CSP: no script runs,
nothing is fetched, no element or handler of the input's making exists in the DOM.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hvconform.report import render_all
from hvconform.report.browser import Chromium, find_chromium
from hvconform.report.text import visible
from tests.report.hostile import (
    CONTROL,
    HTML_TAGS,
    MD_TAGS,
    PAYLOADS,
    commonmark,
    crafted,
    inspect,
    live_markup,
    write_run,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        pytest.fail("the HTML report tests need Chromium: apt-get install chromium")
    with Chromium(executable) as chromium:
        yield chromium


@pytest.fixture
def reports(tmp_path: Path) -> dict[str, Path]:
    return render_all(write_run(tmp_path, crafted()), tmp_path / "run")


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def shown_text(html: str) -> str:
    """What a reader sees of an HTML page: its text, white space folded."""
    parser = _Text()
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


def test_report_md_renders_no_live_markup(reports: dict[str, Path]) -> None:
    text = reports["markdown"].read_text()
    assert not CONTROL.search(text.replace("\n", "")), "a control character reached report.md"
    assert "\u241b" in text  # ESC is shown as its control picture
    html = commonmark(text)
    assert live_markup(html, MD_TAGS) == []
    # The input's text survives as text: a reader sees what the plugin wrote.
    assert "<script>alert(1)</script>" in shown_text(html)
    assert "[click](javascript:alert(1))" in shown_text(html)
    for url in inspect(html).urls:
        assert re.fullmatch(r"[A-Za-z0-9%._~/-]+", url), url


def test_report_md_table_keeps_one_row_and_two_cells_per_check(
    reports: dict[str, Path],
) -> None:
    html = commonmark(reports["markdown"].read_text())
    table = html.split("<table>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    data = crafted()
    checks = {c["id"] for c in data["checks"]} | set(data["run"]["planned"])
    assert len(rows) == 1 + len(checks)
    assert all(len(re.findall(r"<t[hd][ >]", row)) == 2 for row in rows)


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_each_payload_is_shown_as_text(tmp_path: Path, payload: str) -> None:
    data = crafted("all-passed")
    data["checks"][1].update(status="failed", reason=payload, evidence=[])
    text = render_all(write_run(tmp_path, data), tmp_path / "out")["markdown"].read_text()
    html = commonmark(text)
    assert live_markup(html, MD_TAGS) == []
    assert " ".join(visible(payload).split()) in shown_text(html)


def test_links_to_evidence_stay_inside_the_run(reports: dict[str, Path]) -> None:
    text = reports["markdown"].read_text()
    # Names that leave the run directory are shown, not linked, and never looked up.
    assert "`/etc/shadow` (outside the run directory: not linked)" in text
    assert "`../../../etc/passwd` (outside the run directory: not linked)" in text
    assert "[plain.log](evidence/plain.log)" in text
    assert "(evidence/evil%5D%28javascript%3Aalert%281%29%29)" in text


def test_junit_is_well_formed_and_shows_controls(reports: dict[str, Path]) -> None:
    raw = reports["junit"].read_text()
    root = ET.fromstring(raw.encode())  # noqa: S314 (our own junit.xml: it must parse)
    assert not CONTROL.search(raw.replace("\n", ""))
    cases = root.findall(".//testcase")
    assert len(cases) == int(root.attrib["tests"]) > 0
    assert any("\u241b" in (e.text or "") for e in root.iter("system-out"))


def test_report_html_has_no_raw_controls(reports: dict[str, Path]) -> None:
    html = reports["html"].read_text()
    assert not CONTROL.search(html.replace("\n", "")), "a control character reached report.html"
    assert live_markup(html, HTML_TAGS) == []


def _bare(html: str, path: Path) -> str:
    """The page without its CSP, so a live payload would really run or fetch."""
    path.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html))
    return path.as_uri()


def test_crafted_reports_in_chromium(
    browser: Chromium, reports: dict[str, Path], tmp_path: Path
) -> None:
    pages = (
        (reports["html"].read_text(), HTML_TAGS, "report.html"),
        (commonmark(reports["markdown"].read_text()), MD_TAGS | {"html", "head", "body"}, "md"),
    )
    for html, allowed, name in pages:
        uri = _bare(html, tmp_path / f"bare-{name}.html")
        page = browser.load(uri)
        assert page.requests == [uri], f"{name}: fetched {page.requests}"
        assert page.layout["scripts"] == 0, name
        assert live_markup(page.dom, allowed) == [], name
