"""report.html in a real headless Chromium: every check, every timeline, no request leaves it.

Chromium is required: without it these tests fail (apt-get install chromium), never skip. The
screenshots and the printed PDF land in the run's evidence/ dir, and in $HV_REPORT_ARTIFACTS
when that is set, so a person can look at what the report shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hvconform.report import render_all
from hvconform.report.browser import Chromium, find_chromium
from tests.report.conftest import NAMES, make_run

URL_ATTRS = {"src", "href", "xlink:href", "action", "formaction", "poster", "srcset", "data"}


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        pytest.fail("the HTML report tests need Chromium: apt-get install chromium")
    with Chromium(executable) as chromium:
        yield chromium


class _Refs(HTMLParser):
    """Every URL-bearing attribute and every tag of a document."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.urls += [v for k, v in attrs if k in URL_ATTRS and v]


def external_references(html: str) -> list[str]:
    refs = _Refs()
    refs.feed(html)
    found = [u for u in refs.urls if re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", u, re.I)]
    found = [u for u in found if not u.strip().lower().startswith("data:")]
    found += re.findall(r"@import|url\(\s*['\"]?(?!data:)[^)]*\)", html)
    found += ["<script>"] * refs.tags.count("script")
    return found


def keep(path: Path, name: str) -> None:
    artefacts = os.environ.get("HV_REPORT_ARTIFACTS", "")
    if artefacts:
        Path(artefacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artefacts) / name)


@pytest.mark.parametrize("name", NAMES)
def test_report_html_in_chromium(browser: Chromium, tmp_path: Path, name: str) -> None:
    results = make_run(tmp_path, name)
    data = json.loads(results.read_text())
    html_path = render_all(results, results.parent)["html"]
    html = html_path.read_text()
    assert external_references(html) == []
    assert "default-src 'none'" in html  # the page forbids fetches on its own, too
    # Load a copy without the policy, so a stray reference would really be requested and seen.
    bare = html_path.with_name("report-no-csp.html")
    bare.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html))
    page = browser.load(bare.as_uri(), pdf=True)
    assert page.requests == [bare.as_uri()], f"requests beyond the page itself: {page.requests}"
    assert page.layout["scripts"] == 0

    ids = [c["id"] for c in data["checks"]] + data["run"].get("planned", [])
    for check_id in ids:
        assert f'data-check="{check_id}"' in page.dom and f'id="check-{check_id}"' in page.dom
    faults = {c["id"] for c in data["checks"] if len(c.get("timeline", [])) > 1}
    drawn = {s["check"]: s for s in page.layout["svgs"]}
    assert set(drawn) == faults
    assert all(s["width"] > 300 and s["height"] > 50 for s in drawn.values())

    phone = browser.load(bare.as_uri(), width=390, height=844, mobile=True)
    assert phone.layout["scrollWidth"] <= phone.layout["innerWidth"], "page scrolls sideways"

    evidence = results.parent / "evidence"
    for suffix, content in (
        ("png", page.screenshot),
        ("pdf", page.pdf),
        ("phone.png", phone.screenshot),
    ):
        out = evidence / f"report.{suffix}"
        out.write_bytes(content)
        keep(out, f"{name}-report.{suffix}")
    assert page.screenshot.startswith(b"\x89PNG") and len(page.screenshot) > 20_000
    assert page.pdf.startswith(b"%PDF")


def test_the_request_capture_sees_a_stray_reference(browser: Chromium, tmp_path: Path) -> None:
    # The negative control: without it, "no requests" could mean the capture sees nothing.
    page_path = tmp_path / "stray.html"
    page_path.write_text(
        '<!doctype html><link rel="stylesheet" href="https://report-test.invalid/x.css">'
        '<img src="http://report-test.invalid/pixel.png"><p>stray</p>'
    )
    assert len(external_references(page_path.read_text())) == 2
    page = browser.load(page_path.as_uri())
    assert "https://report-test.invalid/x.css" in page.requests
    assert "http://report-test.invalid/pixel.png" in page.requests


def test_cli_screenshot_is_bundled(tmp_path: Path) -> None:
    import argparse
    import tarfile

    from hvconform.report.cli import register

    if find_chromium() is None:
        pytest.fail("the HTML report tests need Chromium: apt-get install chromium")
    results = make_run(tmp_path, "all-passed")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["report", str(results), "--screenshot"])
    assert ns.func(ns) == 0
    assert (results.parent / "evidence" / "report.png").read_bytes().startswith(b"\x89PNG")
    with tarfile.open(results.parent / "evidence.tar.gz") as tar:
        assert any(n.endswith("/evidence/report.png") for n in tar.getnames())
