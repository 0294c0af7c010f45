"""Statuses, reasons, waits and timeline events travel as typed fields, never words parsed back.

An AST scan of conformance/report and conformance/suite: every prefix or suffix match
(startswith, endswith, removeprefix, removesuffix), every `re` call and every `import re` /
`import fnmatch` must be one of the uses listed in ALLOWED, each with why it is not about a
status, a reason or an event. report.legacy is the one reader of words, for results written
before schema 1.3 (tests/report/test_typed_results.py feeds it a 1.2 file).
"""

from __future__ import annotations

import ast

from tests.report.conftest import ROOT

PACKAGES = ("conformance/report", "conformance/suite")
_MATCHERS = frozenset({"startswith", "endswith", "removeprefix", "removesuffix"})
_MODULES = frozenset({"re", "fnmatch"})

# (file, enclosing function or "<module>", what) -> why it is allowed.
R, S = "conformance/report/", "conformance/suite/"
# fmt: off
ALLOWED: dict[tuple[str, str, str], str] = {
    (R + "legacy.py", "<module>", "import re"):
        "the one reader of pre-1.3 words, isolated for old results files",
    (R + "legacy.py", "<module>", "re.compile"):
        "the pre-1.3 wait message and pytest's exception prefix, for old results files only",
    (R + "compare_model.py", "is_duration", "endswith"):
        "a metric's name: *_s metrics are durations (a figure, not a status or reason)",
    (R + "words.py", "value", "endswith"): "a metric's name: *_s durations, *_share percentages",
    (S + "pytest_plugin.py", "_progress", "endswith"):
        "a metric's name: the progress line shows the *_s durations",
    (R + "evidence.py", "<module>", "import fnmatch"): "the bundle's globs over file names",
    (R + "evidence.py", "select", "fnmatch.fnmatchcase"): "the bundle's globs over file names",
    (R + "evidence.py", "_layout", "fnmatch.fnmatchcase"): "the bundle's globs over file names",
    (R + "evidence.py", "select", "endswith"): "a file name: .tmp files stay out of the bundle",
    (R + "evidence.py", "<module>", "import re"): "the bundle's archive name from the run id",
    (R + "evidence.py", "bundle", "re.sub"): "the run id made safe as an archive name",
    (R + "junit.py", "<module>", "import re"): "XML sanitising",
    (R + "junit.py", "<module>", "re.compile"): "the control characters XML 1.0 cannot carry",
    (R + "junit.py", "render", "removesuffix"): "the run's ISO timestamp: JUnit's has no Z",
    (R + "render.py", "<module>", "import re"): "Markdown code spans in HTML",
    (R + "render.py", "_ticks", "re.sub"): "`code` spans become <code> in HTML",
    (R + "render.py", "_when", "endswith"): "the run's ISO timestamp (UTC 'Z')",
    (R + "render.py", "_when", "removesuffix"): "the run's ISO timestamp (UTC 'Z')",
    (R + "render.py", "append_step_summary", "endswith"): "the summary file's last newline",
    (R + "text.py", "<module>", "import re"): "escaping for Markdown and hrefs",
    (R + "text.py", "<module>", "re.compile"):
        "hidden characters, Markdown punctuation, safe href characters",
    (R + "text.py", "md_escape", "re.sub"): "Markdown entity escaping",
    (R + "text.py", "md_ticks", "re.split"): "Markdown code spans",
    (S + "environment.py", "_os_release", "startswith"): "/etc/os-release's PRETTY_NAME line",
    (S + "identity.py", "<module>", "import re"): "the running plugin's argv against its profile",
    (S + "identity.py", "<module>", "re.compile"): "the profile's health-address placeholders",
    (S + "identity.py", "_norm", "startswith"): "an image reference's registry prefix",
    (S + "identity.py", "_patterns", "re.compile"): "an argv pattern from the profile's command",
    (S + "identity.py", "_patterns", "re.escape"): "an argv pattern from the profile's command",
}
# fmt: on


def text_matches(source: str, path: str) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, what, line) of every text match in one module's source."""
    tree = ast.parse(source)
    scope: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                scope.setdefault(id(node), fn.name)  # the outermost function names the scope
    found = []
    for node in ast.walk(tree):
        what = ""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MATCHERS:
                what = node.func.attr
            elif isinstance(node.func.value, ast.Name) and node.func.value.id in _MODULES:
                what = f"{node.func.value.id}.{node.func.attr}"
        elif isinstance(node, ast.Import):
            what = next((f"import {a.name}" for a in node.names if a.name in _MODULES), "")
        elif isinstance(node, ast.ImportFrom) and node.module in _MODULES:
            what = f"import {node.module}"
        if what:
            line = getattr(node, "lineno", 0)  # every node matched above is a statement or call
            found.append((path, scope.get(id(node), "<module>"), what, line))
    return found


def all_matches() -> list[tuple[str, str, str, int]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += text_matches(path.read_text(), path.relative_to(ROOT).as_posix())
    return found


def test_no_status_reason_or_event_is_matched_by_its_text() -> None:
    unexpected = [
        f"{path}:{line} in {where}: {what}"
        for path, where, what, line in all_matches()
        if (path, where, what) not in ALLOWED
    ]
    assert not unexpected, (
        "status, reason and event travel as typed fields (hvconform.suite.outcomes, "
        "results 1.3); a text match needs an ALLOWED entry saying why it is about something "
        "else:\n" + "\n".join(unexpected)
    )


def test_every_allowed_use_still_exists() -> None:
    """An allowance whose code is gone is removed, so the list never covers a new use."""
    used = {(path, where, what) for path, where, what, _ in all_matches()}
    assert not set(ALLOWED) - used, sorted(set(ALLOWED) - used)


def test_the_scan_sees_the_matches_it_forbids() -> None:
    planted = """
import re
def status_of(text):
    if text.startswith("not_applicable: "):
        return text.removeprefix("not_applicable: ")
    return re.sub(r"^\\w+Error: ", "", text)
"""
    found = {(where, what) for _, where, what, _ in text_matches(planted, "x.py")}
    assert found == {
        ("<module>", "import re"),
        ("status_of", "startswith"),
        ("status_of", "removeprefix"),
        ("status_of", "re.sub"),
    }
