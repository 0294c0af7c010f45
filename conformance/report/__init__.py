"""Reports people can trust and read, rendered from one canonical results.json.

report.md (terminal, GitHub, step summary), report.html (self-contained, SVG timelines),
junit.xml (CI test views) and evidence.tar.gz (every file of the run, with SHA256SUMS).
Reporting reads results only: it imports nothing of the suite but hvconform.contract.results.
"""

from __future__ import annotations

from hvconform.report.render import (
    ReportError,
    append_step_summary,
    load_results,
    render_all,
    render_html,
    render_markdown,
)

__all__ = [
    "ReportError",
    "append_step_summary",
    "load_results",
    "render_all",
    "render_html",
    "render_markdown",
]
