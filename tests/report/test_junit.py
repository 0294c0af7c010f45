"""junit.xml: parses with xml.etree, one testcase per check, statuses CI systems understand."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from hvconform.report import render_all
from tests.report.conftest import FIXTURES


def parse(path: Path) -> ET.Element:
    """CI systems read junit.xml with plain parsers; ours is the file we just wrote."""
    return ET.parse(path).getroot()  # noqa: S314


def test_one_testcase_per_check(run_results: Path, name: str) -> None:
    data = json.loads(run_results.read_text())
    files = render_all(run_results, run_results.parent)
    root = parse(files["junit"])
    cases = root.findall("./testsuite/testcase")
    ran = [c["id"] for c in data["checks"]]
    expected = ran + [i for i in data["run"].get("planned", []) if i not in ran]
    assert [c.get("name") for c in cases] == expected
    by_id = {c["id"]: c for c in data["checks"]}
    for case in cases:
        check = by_id.get(str(case.get("name")))
        status = check["status"] if check else "not_run"
        marker = check["marker"] if check else "unknown"
        assert case.get("classname") == f"hvconform.{marker}"
        failure, skipped = case.find("failure"), case.find("skipped")
        assert (failure is not None) == (status == "failed")
        assert (skipped is not None) == (status not in ("passed", "failed"))
        if skipped is not None:
            assert str(skipped.get("message")).startswith(f"{status}: ")
    suite = root.find("testsuite")
    assert suite is not None
    assert int(str(suite.get("tests"))) == len(cases)
    assert int(str(suite.get("failures"))) == sum(1 for c in cases if c.find("failure") is not None)
    assert int(str(suite.get("skipped"))) == sum(1 for c in cases if c.find("skipped") is not None)


def test_a_failure_message_names_the_wait(tmp_path: Path) -> None:
    from tests.report.conftest import make_run

    results = make_run(tmp_path, "failed-wait-expired")
    root = parse(render_all(results, results.parent)["junit"])
    case = root.find("./testsuite/testcase[@name='cdi-missing']")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("type") == "wait"  # the kind, never a Python class name
    assert failure.get("message") == (
        "waited 30 s for CDI spec byte-exact again (missing spec): the condition still did not hold"
    )
    assert "evidence: evidence/cdi-missing-plugin.log" in str(failure.text)
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["verdict"] == "FAILED" and props["run_id"] == "20261202T170501Z-20811"


def test_control_characters_cannot_break_the_xml(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "failed-wait-expired.json").read_text())
    data["checks"][1]["reason"] = "AssertionError: bad byte \x01 and \x1b[31mcolour"
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(data))
    root = parse(render_all(run / "results.json", run)["junit"])
    failure = root.find("./testsuite/testcase[@name='cdi-missing']/failure")
    assert failure is not None and "bad byte" in str(failure.get("message"))
