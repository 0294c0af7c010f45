"""Render a results.json into report.md, report.html, junit.xml and evidence.tar.gz."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from hvconform.contract import strict_json
from hvconform.contract.manifest import ManifestError
from hvconform.contract.results import validate_results
from hvconform.contract.safewrite import write_atomic
from hvconform.report import evidence, junit, svg, text
from hvconform.report.model import ReportView, build
from hvconform.report.words import duration

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub refuses a step summary larger than 1 MiB
# What `hvconform report` and `compare` read: a full run's results.json is under 1 MiB and a
# few thousand values; the work after the load (schema, model, three outputs) grows with both,
# so both are capped well above any real run and far below what takes minutes.
MAX_RESULTS_BYTES = 8 * 1024 * 1024
MAX_RESULTS_VALUES = 50_000


class ReportError(Exception):
    """The results file cannot be reported on (missing, not JSON, not the schema)."""


def _ticks(value: object) -> Markup:
    """HTML for text whose `backticked` words are code: escaped first, then the spans marked."""
    escaped = str(escape(str(value)))
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))  # noqa: S704


def _when(stamp: object) -> str:
    """'2026-12-02T16:21:43Z' -> '2026-12-02 16:21:43 UTC'."""
    text = str(stamp)
    return text.replace("T", " ").removesuffix("Z") + " UTC" if text.endswith("Z") else text


def _seconds(value: object) -> str:
    return duration(float(value)) if isinstance(value, int | float) else str(value)


def environment(markdown: bool = False) -> jinja2.Environment:
    """Templates ship inside the package. HTML templates autoescape; the Markdown environment
    escapes every {{ }} for Markdown unless a filter (md, code) already made it Markdown."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hvconform.report", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
        undefined=jinja2.StrictUndefined,  # a misspelt field fails the render, never prints ""
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=text.md_finalize if markdown else None,
    )
    env.filters.update(
        md=text.md_text,
        code=text.md_code,
        mdticks=text.md_ticks,
        url=text.md_url,
        when=_when,
        seconds=_seconds,
        ticks=_ticks,
    )
    return env


def render_markdown(view: ReportView) -> str:
    return environment(markdown=True).get_template("report.md.j2").render(r=view)


def render_html(view: ReportView) -> str:
    # The SVG is built from escaped parts in svg.py, so it is marked safe here, once.
    timelines = {c.id: Markup(svg.timeline(c)) for c in view.fault_checks}  # noqa: S704
    chart = Markup(svg.recovery_chart(view.checks))  # noqa: S704
    legend = Markup(svg.legend())  # noqa: S704
    template = environment().get_template("report.html.j2")
    return template.render(r=view, timelines=timelines, chart=chart, legend=legend)


def load_results(results_path: Path) -> dict[str, Any]:
    """Read and validate a results.json; ReportError (one line) names the file and the problem.

    Strict (hvconform.contract.strict_json): a regular file of at most MAX_RESULTS_BYTES and
    MAX_RESULTS_VALUES values, UTF-8, no NaN or Infinity, no duplicate key, integers and nesting
    bounded; then the shipped JSON Schema.
    """
    try:
        data = strict_json.load(
            results_path,
            label="results",
            max_bytes=MAX_RESULTS_BYTES,
            max_values=MAX_RESULTS_VALUES,
        )
    except strict_json.JsonInputError as exc:
        raise ReportError(str(exc)) from None
    if not isinstance(data, dict):
        raise ReportError(f"{results_path}: does not follow the results schema: not an object")
    try:
        validate_results(data)
    except Exception as exc:  # jsonschema.ValidationError; jsonschema is untyped here
        message = strict_json.one_line(str(getattr(exc, "message", exc)))
        raise ReportError(
            f"{results_path}: does not follow the results schema: {message}"
        ) from None
    return data


def _write(path: Path, text: str) -> Path:
    return write_atomic(path, text)


def render_all(
    results_path: Path,
    out_dir: Path,
    *,
    partial: bool = False,
    also: Sequence[Path] = (),
    data: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Write every report for results_path into out_dir; returns the files by kind.

    Call it at the end of every run, also a failed or interrupted one (partial=True when the run
    did not reach every check). The evidence bundle is chosen first, so the report can name
    what it left out, and written last, so it holds the reports too; `also` names further files
    this command wrote into the run directory (a screenshot) that the bundle should hold.
    ReportError (one line) for results or an output directory that cannot be used. `data`:
    what load_results(results_path) returned already (it is not read and checked twice).
    """
    try:
        return _render_all(results_path.resolve(), out_dir.resolve(), partial, also, data)
    except OSError as exc:  # an unwritable or vanished output directory, a full disk
        where = f" {exc.filename}" if exc.filename else ""
        raise ReportError(f"cannot write the reports:{where}: {exc.strerror or exc}") from None


def _render_all(
    results_path: Path,
    out_dir: Path,
    partial: bool,
    also: Sequence[Path],
    data: dict[str, Any] | None,
) -> dict[str, Path]:
    data = load_results(results_path) if data is None else data
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"--out {out_dir}: exists and is not a directory")
    run_dir = results_path.parent
    dest = out_dir / "evidence.tar.gz"
    try:
        selection = evidence.select(run_dir, frozenset({os.path.relpath(dest, run_dir)}))
    except ManifestError as exc:
        raise ReportError(str(exc)) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    view = build(data, run_dir, out_dir, partial=partial, bundle_notes=selection.notes)
    files = {
        "markdown": _write(out_dir / "report.md", render_markdown(view)),
        "html": _write(out_dir / "report.html", render_html(view)),
        "junit": _write(out_dir / "junit.xml", junit.render(view)),
    }
    # Files this command wrote travel with the evidence: under their own names inside the run
    # dir, under report/ when rendered elsewhere.
    extra = {
        (p.relative_to(run_dir).as_posix() if p.is_relative_to(run_dir) else f"report/{p.name}"): p
        for p in [*files.values(), *(a.resolve() for a in also)]
    }
    finished = str(view.run.get("finished_at", ""))
    files["evidence"] = evidence.bundle(
        run_dir, dest, str(view.run["id"]), finished, extra, selection
    )
    return files


def append_step_summary(markdown: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append report.md to $GITHUB_STEP_SUMMARY when it is set; returns the summary file.
    ReportError when that file cannot be appended to."""
    target = (os.environ if environ is None else environ).get("GITHUB_STEP_SUMMARY", "")
    if not target:
        return None
    text = markdown.read_text(encoding="utf-8")
    if len(text.encode()) > STEP_SUMMARY_LIMIT - 4096:
        cut = text.encode()[: STEP_SUMMARY_LIMIT - 4096].decode(errors="ignore")
        text = cut + f"\n\n(truncated: the full report is {markdown.name} in the run's artefacts)\n"
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as summary:
            summary.write(text if text.endswith("\n") else text + "\n")
    except OSError as exc:
        raise ReportError(f"GITHUB_STEP_SUMMARY {target}: {exc.strerror or exc}") from None
    return path
