"""Hostile input for the report tests: payloads, a crafted results.json, and markup inspectors.

The inspectors decide "live markup" the way a reader's software would: report.md is rendered by
a real CommonMark renderer (markdown-it-py, raw HTML allowed and every link accepted, so nothing
is left to the renderer's own sanitising), and the HTML is parsed for what a browser would act
on: elements that run or fetch, event-handler attributes, links that leave the page.
"""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from tests.report.conftest import FIXTURES

PAYLOADS = (
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(1)>',
    "[click](javascript:alert(1))",
    "![pixel](http://report-test.invalid/p.png)",
    "<javascript:alert(1)>",
    '<a href="javascript:alert(1)">a</a>',
    "&lt;script&gt; &#60;img src=x onerror=alert(1)&#62;",
    "`code` | pipe | ```fence```",
    "line one\n# heading\n<iframe src=x></iframe>",
    "NUL\x00 ESC\x1b[2J BEL\x07 DEL\x7f CSI\x9b RLO\u202e end",
    "]]></system-out><script>x</script>",
)
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Tags the report templates write themselves (measured on the fixtures' reports); any other tag
# in an output came from input.
HTML_TAGS = {
    "a", "article", "body", "circle", "code", "dd", "div", "dl", "dt", "figcaption", "figure",
    "g", "h1", "h2", "h3", "head", "header", "html", "li", "line", "main", "meta", "p",
    "polyline", "rect", "section", "span", "strong", "style", "svg", "table", "tbody", "td",
    "text", "th", "thead", "title", "tr", "ul",
}  # fmt: skip
MD_TAGS = {
    "a", "blockquote", "code", "em", "h1", "h2", "h3", "li", "p", "strong", "table", "tbody",
    "td", "th", "thead", "tr", "ul",
}  # fmt: skip


def payload(i: int) -> str:
    return PAYLOADS[i % len(PAYLOADS)]


def crafted(base: str = "failed-wait-expired") -> dict[str, Any]:
    """A schema-valid results document with a payload in every string a plugin or a person
    could put there: run facts, environment keys and values, check texts, metrics, evidence."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{base}.json").read_text())
    run = data["run"]
    run["id"] = "run " + payload(0)
    run["target"] = payload(1)
    run["started_at"] = payload(3)
    run["finished_at"] = payload(2)
    run["markexpr"] = payload(8)
    run["plugin_cmd"] = payload(6)
    run["partial"] = True
    run["interruption"] = payload(9)
    run["planned"] = [*run.get("planned", []), "x`) <script>alert(1)</script>"]
    run["scope_limits"] = list(PAYLOADS)
    env = data["environment"]
    env["kernel"] = payload(1)
    env[payload(0)] = payload(10)
    env["hostname"] = payload(4)
    for n, check in enumerate(data["checks"]):
        check["title"] = payload(n)
        check["marker"] = payload(n + 1)
        check["notes"] = [payload(n + 2), payload(n + 3)]
        check["metrics"] = {payload(n + 4): payload(n + 5), "recovery_s": 0.5, "note_s": payload(n)}
        check["timeline"] = [{"name": payload(n + k), "t_s": k * 0.01} for k in range(3)]
        if check["status"] != "passed":
            check["reason"] = payload(n + 6)
        check["evidence"] = [
            "javascript:alert(1)//x",
            "../../../etc/passwd",
            "/etc/shadow",
            'x)<script>alert(1)</script>"',
            "evil](javascript:alert(1))",
            "plain.log",
        ]
    data["checks"][0]["status"] = "failed"
    data["checks"][0]["reason"] = (
        "wait '" + payload(0) + "' expired after 30s (last: " + payload(1) + ")"
    )
    return data


def write_run(tmp_path: Path, data: dict[str, Any]) -> Path:
    run = tmp_path / "run"
    (run / "evidence").mkdir(parents=True, exist_ok=True)
    (run / "evidence" / "plain.log").write_text("plain\n")
    (run / "results.json").write_text(json.dumps(copy.deepcopy(data)))
    return run / "results.json"


class Markup(HTMLParser):
    """Every element, every event-handler attribute and every URL-bearing value of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.handlers: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"<{tag} {name}>")
            if name in ("href", "src", "xlink:href", "action", "formaction", "data", "srcset"):
                self.urls.append(value or "")


def inspect(html: str) -> Markup:
    found = Markup()
    found.feed(html)
    found.close()
    return found


def live_markup(html: str, allowed_tags: set[str]) -> list[str]:
    """What in html came alive from input: foreign elements, handlers, non-relative links."""
    found = inspect(html)
    problems = [f"<{t}>" for t in found.tags if t not in allowed_tags]
    problems += found.handlers
    for url in found.urls:
        if re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", url, re.I) and not url.startswith("#"):
            problems.append(f"link {url!r}")
    return problems


def commonmark(text: str) -> str:
    """report.md as a permissive renderer shows it: raw HTML on, every link target accepted."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    return str(md.render(text))
