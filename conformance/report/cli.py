"""`hvconform report RESULTS.json [--out DIR]`: every report from one results file.

Exit 0 when every check passed, 1 when a check failed or the run was partial (so a pipeline can
gate on the report as on the run), 2 when the results cannot be read or rendered.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_NOT_CLEAN = 1
EXIT_UNREADABLE = 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `report` subcommand; its func is runner."""
    parser = sub.add_parser(
        "report",
        help="render results.json as report.md, report.html, junit.xml and evidence.tar.gz",
        description="Render one results.json into Markdown, self-contained HTML (timelines as SVG),"
        " JUnit XML and a deterministic evidence bundle of its run directory. Appends report.md"
        " to $GITHUB_STEP_SUMMARY when that is set. Exit 1 when a check failed or the run was"
        " partial, 2 when the results cannot be read.",
    )
    parser.add_argument("results", type=Path, help="a results.json written by hvconform run")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: next to RESULTS)"
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="mark the run partial even if results.json does not say so",
    )
    parser.add_argument(
        "--screenshot",
        action="store_true",
        help="also render report.html in headless Chromium to evidence/report.png (before bundling)",
    )
    parser.set_defaults(func=runner)


def runner(ns: argparse.Namespace) -> int:
    # Imported here so `hvconform --help` does not load jinja2.
    from hvconform.contract.strict_json import one_line
    from hvconform.report.browser import BrowserError, capture
    from hvconform.report.model import verdict
    from hvconform.report.render import ReportError, append_step_summary, load_results, render_all

    results: Path = ns.results
    out: Path = ns.out or results.parent
    try:
        data = load_results(results)  # read and checked once: its cost grows with the file
        files = render_all(results, out, partial=ns.partial, data=data)
        if ns.screenshot:
            png = results.resolve().parent / "evidence" / "report.png"
            capture(files["html"], png)
            # Rendered again so the bundle holds the screenshot too.
            files = render_all(results, out, partial=ns.partial, also=[png], data=data)
            files["screenshot"] = png
    except (ReportError, BrowserError) as exc:
        print(f"hvconform report: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        summary = append_step_summary(files["markdown"])
    except ReportError as exc:
        print(f"hvconform report: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_UNREADABLE
    for kind, path in files.items():
        print(f"hvconform report: {kind:<10} {one_line(str(path))}")
    if summary is not None:
        print(f"hvconform report: appended report.md to {one_line(str(summary))}")
    return 0 if verdict(data, partial=ns.partial) == "PASSED" else EXIT_NOT_CLEAN
