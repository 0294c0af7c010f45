"""compare.html in a real headless Chromium, as report.html is tested: every check id visible,
the regression highlighted, hostile input inert, no request leaving the page, no sideways scroll
on a phone, and a printable PDF.

Chromium is required: without it these tests fail (apt-get install chromium), never skip.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.report.browser import Chromium, find_chromium
from hvconform.report.compare import main
from tests.report.conftest import FIXTURES
from tests.report.test_html_browser import external_references, keep

PAIR = FIXTURES / "compare"

# What the eye sees of each row of the results table, and of the hostile text.
_ROWS = """JSON.stringify({
  rows: Array.from(document.querySelectorAll('#results tr[data-check]')).map(tr => ({
    id: tr.dataset.check, kind: tr.className, text: tr.innerText,
    height: tr.getBoundingClientRect().height,
    background: getComputedStyle(tr.cells[0]).backgroundColor,
    change: tr.querySelector('.change').innerText})),
  elements: Array.from(document.body.querySelectorAll('*')).map(e => e.tagName.toLowerCase()),
  hostile: document.querySelector('#environment').innerText
})"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        pytest.fail("the HTML report tests need Chromium: apt-get install chromium")
    with Chromium(executable) as chromium:
        yield chromium


def evaluate(browser: Chromium, url: str, expression: str) -> Any:
    """Load url in a fresh tab and return what expression (a JSON string) says about it."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    attached = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})
    session = attached["sessionId"]
    try:
        browser.call("Page.enable", session=session)
        browser.call("Page.navigate", {"url": url}, session=session)
        browser.wait_event("Page.loadEventFired", session)
        answer = browser.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True},
            session=session,
        )
    finally:
        browser.call("Target.closeTarget", {"targetId": target})
    return json.loads(answer["result"]["value"])


def _hostile_pair(tmp_path: Path) -> tuple[Path, Path]:
    ours = PAIR / "ours"
    data = json.loads((PAIR / "go-kvm" / "results.json").read_text())
    data["environment"]["note"] = (
        '<img src="https://compare-test.invalid/x.png"><script>x()</script>'
    )
    go = tmp_path / "go-kvm"
    go.mkdir()
    (go / "results.json").write_text(json.dumps(data))
    return ours, go


def test_compare_html_in_chromium(browser: Chromium, tmp_path: Path) -> None:
    ours, go = _hostile_pair(tmp_path)
    out = tmp_path / "out"
    assert main([str(ours), str(go), "--out", str(out)]) == 0
    html_path = out / "compare.html"
    html = html_path.read_text()
    assert external_references(html) == []
    assert "default-src 'none'" in html
    # Load a copy without the policy, so a stray reference would really be requested and seen.
    bare = html_path.with_name("compare-no-csp.html")
    bare.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html))
    page = browser.load(bare.as_uri(), pdf=True)
    assert page.requests == [bare.as_uri()], f"requests beyond the page itself: {page.requests}"
    assert page.layout["scripts"] == 0

    seen = evaluate(browser, bare.as_uri(), _ROWS)
    rows = {r["id"]: r for r in seen["rows"]}
    ids = [c["id"] for c in json.loads((ours / "results.json").read_text())["checks"]]
    ids += [c["id"] for c in json.loads((go / "results.json").read_text())["checks"]]
    assert set(rows) == set(ids)
    for check_id, row in rows.items():
        assert check_id in row["text"] and row["height"] > 10, f"{check_id} not visible"

    regression = rows["cdi-missing"]
    assert regression["kind"] == "regression" and regression["change"] == "Regression"
    assert "Passed → FAILED" in regression["text"]
    plain = rows["cdi-malformed"]
    assert plain["kind"] == "same"
    assert regression["background"] != plain["background"], "the regression is not highlighted"
    red, green, blue = (int(v) for v in re.findall(r"\d+", regression["background"])[:3])
    assert red > green and red > blue, f"regression row is not red: {regression['background']}"
    assert rows["restart-kubelet"]["kind"] == "slower"
    assert rows["restart-kubelet"]["background"] == regression["background"]
    assert rows["cdi-stale"]["kind"] == "fixed"

    # The hostile value is shown as text, never turned into an element.
    assert '<img src="https://compare-test.invalid/x.png"><script>x()</script>' in seen["hostile"]
    assert "img" not in seen["elements"] and "script" not in seen["elements"]

    phone = browser.load(bare.as_uri(), width=390, height=844, mobile=True)
    assert phone.layout["scrollWidth"] <= phone.layout["innerWidth"], "page scrolls sideways"
    for suffix, content in (
        ("png", page.screenshot),
        ("pdf", page.pdf),
        ("phone.png", phone.screenshot),
    ):
        saved = out / f"compare.{suffix}"
        saved.write_bytes(content)
        keep(saved, f"compare.{suffix}")
    assert page.screenshot.startswith(b"\x89PNG") and len(page.screenshot) > 20_000
    assert page.pdf.startswith(b"%PDF")
