"""junit.xml derived from the results: one testcase per check, classname per marker.

CI systems show JUnit natively; statuses other than passed and failed become <skipped> with the
status in the message, so a blocked or inapplicable check never shows as a pass.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from hvconform.report.model import CheckView, ReportView
from hvconform.report.words import duration

_XML_INVALID = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    """XML 1.0 cannot carry most control characters; a stray byte must not break the file."""
    return _XML_INVALID.sub("\N{REPLACEMENT CHARACTER}", text)


def _details(check: CheckView) -> str:
    lines = [f"{check.title} ({check.id}): {check.result}"]
    lines += [f"metric {name} = {raw} ({said})" for name, raw, said in check.metric_rows()]
    lines += [f"event +{duration(e.t_s)} [{e.kind}] {e.name}" for e in check.timeline]
    lines += [f"note: {n}" for n in check.notes]
    lines += [f"evidence: {e.href}" for e in check.evidence]
    if check.hidden_figures or check.hidden_events:
        lines.append(
            f"not shown: {check.hidden_figures} more figures, {check.hidden_events} more events "
            "(the report's caps); results.json holds every one"
        )
    return _clean("\n".join(lines))


def _testcase(suite: ET.Element, check: CheckView) -> None:
    classname = f"hvconform.{check.marker or 'unknown'}"
    case = ET.SubElement(
        suite, "testcase", classname=classname, name=check.id, time=f"{check.duration_s:.3f}"
    )
    if check.status == "failed":
        kind = check.failure_kind  # wait, assertion or error: never a Python class name
        failure = ET.SubElement(case, "failure", message=_clean(check.reason_words), type=kind)
        failure.text = _details(check)
    elif check.status != "passed":
        ET.SubElement(case, "skipped", message=_clean(f"{check.status}: {check.reason}"))
    out = ET.SubElement(case, "system-out")
    out.text = _details(check)


def render(view: ReportView) -> str:
    """The JUnit XML text; counts agree with the Markdown because both read the same view."""
    failures = sum(1 for c in view.checks if c.status == "failed")
    skipped = sum(1 for c in view.checks if c.status not in ("passed", "failed"))
    total_time = f"{sum(c.duration_s for c in view.checks):.3f}"
    counts = {
        "tests": str(len(view.checks)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": total_time,
    }
    root = ET.Element("testsuites", {"name": "hvconform", **counts})
    stamp = str(view.run.get("started_at", "")).removesuffix("Z")
    suite = ET.SubElement(
        root, "testsuite", {"name": f"hvconform.{view.target}", "timestamp": stamp, **counts}
    )
    props = ET.SubElement(suite, "properties")
    facts = {
        "run_id": str(view.run.get("id", "")),
        "verdict": view.verdict,
        "partial": str(view.partial).lower(),
        "exit_code": str(view.run.get("exit_code", "")),
        **{label.lower().replace(" ", "_"): value for label, value in view.environment},
    }
    for name, value in facts.items():
        ET.SubElement(props, "property", name=name, value=_clean(value))
    for check in view.checks:
        _testcase(suite, check)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
