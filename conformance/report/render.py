"""Render a results.json into report.md, report.html, junit.xml and evidence.tar.gz."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from conformance.contract.results import validate_results
from conformance.report import evidence, junit, svg
from conformance.report.model import ReportView, build
from conformance.report.words import duration

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub refuses a step summary larger than 1 MiB


class ReportError(Exception):
    """The results file cannot be reported on (missing, not JSON, not the schema)."""


def _md(text: object) -> str:
    """Text safe inside a Markdown table cell: one line, no pipes, no raw HTML."""
    value = " ".join(str(text).split())
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: object) -> str:
    """Text safe inside a single-backtick code span."""
    return " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")


def _ticks(text: object) -> Markup:
    """HTML for text whose `backticked` words are code: escaped first, then the spans marked."""
    escaped = str(escape(str(text)))
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))  # noqa: S704


def _when(stamp: object) -> str:
    """'2026-12-02T16:21:43Z' -> '2026-12-02 16:21:43 UTC'."""
    text = str(stamp)
    return text.replace("T", " ").removesuffix("Z") + " UTC" if text.endswith("Z") else text


def _seconds(value: object) -> str:
    return duration(float(value)) if isinstance(value, int | float) else str(value)


def environment() -> jinja2.Environment:
    """Templates ship inside the package; HTML templates autoescape, Markdown ones do not."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("conformance.report", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
        undefined=jinja2.StrictUndefined,  # a misspelt field fails the render, never prints ""
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(md=_md, code=_code, when=_when, seconds=_seconds, ticks=_ticks)
    return env


def render_markdown(view: ReportView) -> str:
    return environment().get_template("report.md.j2").render(r=view)


def render_html(view: ReportView) -> str:
    # The SVG is built from escaped parts in svg.py, so it is marked safe here, once.
    timelines = {c.id: Markup(svg.timeline(c)) for c in view.fault_checks}  # noqa: S704
    chart = Markup(svg.recovery_chart(view.checks))  # noqa: S704
    legend = Markup(svg.legend())  # noqa: S704
    template = environment().get_template("report.html.j2")
    return template.render(r=view, timelines=timelines, chart=chart, legend=legend)


def load_results(results_path: Path) -> dict[str, Any]:
    """Read and validate a results.json; ReportError names the file and what is wrong."""
    try:
        data: dict[str, Any] = json.loads(results_path.read_text())
    except OSError as exc:
        raise ReportError(f"{results_path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ReportError(f"{results_path}: not JSON: {exc}") from exc
    try:
        validate_results(data)
    except Exception as exc:  # jsonschema.ValidationError; jsonschema is untyped here
        message = getattr(exc, "message", str(exc))
        raise ReportError(f"{results_path}: does not follow the results schema: {message}") from exc
    return data


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def render_all(results_path: Path, out_dir: Path, *, partial: bool = False) -> dict[str, Path]:
    """Write every report for results_path into out_dir; returns the files by kind.

    Call it at the end of every run, also a failed or interrupted one (partial=True when the run
    did not reach every check). The evidence bundle is written last so it holds the reports too
    when out_dir is the run directory.
    """
    results_path = results_path.resolve()
    out_dir = out_dir.resolve()
    data = load_results(results_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir = results_path.parent
    view = build(data, run_dir, out_dir, partial=partial)
    files = {
        "markdown": _write(out_dir / "report.md", render_markdown(view)),
        "html": _write(out_dir / "report.html", render_html(view)),
        "junit": _write(out_dir / "junit.xml", junit.render(view)),
    }
    # Reports rendered outside the run dir still travel with the evidence, under report/.
    extra = (
        {} if out_dir.is_relative_to(run_dir) else {f"report/{p.name}": p for p in files.values()}
    )
    finished = str(view.run.get("finished_at", ""))
    dest = out_dir / "evidence.tar.gz"
    files["evidence"] = evidence.bundle(run_dir, dest, str(view.run["id"]), finished, extra)
    return files


def append_step_summary(markdown: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append report.md to $GITHUB_STEP_SUMMARY when it is set; returns the summary file."""
    target = (os.environ if environ is None else environ).get("GITHUB_STEP_SUMMARY", "")
    if not target:
        return None
    text = markdown.read_text(encoding="utf-8")
    if len(text.encode()) > STEP_SUMMARY_LIMIT - 4096:
        cut = text.encode()[: STEP_SUMMARY_LIMIT - 4096].decode(errors="ignore")
        text = cut + f"\n\n(truncated: the full report is {markdown.name} in the run's artefacts)\n"
    path = Path(target)
    with path.open("a", encoding="utf-8") as summary:
        summary.write(text if text.endswith("\n") else text + "\n")
    return path
