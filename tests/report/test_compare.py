"""`hvconform compare A B`: golden Markdown, the changes it calls out, exit codes and bad input.

The two crafted runs (fixtures/results/compare/) differ in one way per kind of change: a
regression (cdi-missing), a fix (cdi-stale), one slower figure (restart-kubelet's crash
re-registration), a figure over the ratio but under the floor (device-unusable), a pass that
became not applicable (registration-failure), a check only B ran, and hostile text in B.
Regenerate the golden files only on purpose: HV_UPDATE_GOLDEN=1 pytest tests/report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from hvconform import cli
from hvconform.report import compare_model as cm
from hvconform.report.compare import compare, load, main, render_markdown
from tests.report.conftest import FIXTURES, GOLDEN

PAIR = FIXTURES / "compare"
OURS, GO = PAIR / "ours", PAIR / "go-kvm"


def view(a: Path = OURS, b: Path = GO, **options: float) -> cm.CompareView:
    return compare(load(str(a)), load(str(b)), PAIR, **options)  # type: ignore[arg-type]


def rows(v: cm.CompareView) -> dict[str, cm.Row]:
    return {r.id: r for r in v.rows}


@pytest.mark.parametrize(("a", "b"), [(OURS, GO), (GO, OURS)], ids=["ours-vs-go", "go-vs-ours"])
def test_markdown_matches_golden(a: Path, b: Path) -> None:
    text = render_markdown(view(a, b))
    golden = GOLDEN / f"compare-{a.name}-vs-{b.name}.md"
    if os.environ.get("HV_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with HV_UPDATE_GOLDEN=1 once, then review it"
    assert text == golden.read_text(), "compare.md changed; review, then HV_UPDATE_GOLDEN=1"


def test_each_change_is_called_out_by_kind() -> None:
    found = rows(view())
    assert found["cdi-missing"].kind == "regression"
    assert found["cdi-missing"].transition == "Passed → FAILED"
    assert found["cdi-stale"].kind == "fixed"
    assert found["registration-failure"].kind == "lost"
    assert found["registration-failure"].transition == "Passed → Not applicable"
    assert found["registration-dir-replaced"].kind == "gained"
    assert found["registration-dir-replaced"].a is None
    assert found["restart-kubelet"].kind == "slower"
    assert [f.name for f in found["restart-kubelet"].slower] == ["reregistration_crash_s"]
    unchanged = {i for i, r in found.items() if r.kind == "same"}
    assert unchanged == {
        "guest-execution",
        "cdi-malformed",
        "cdi-non-regular",
        "cdi-read-only",
        "identity-missing",
        "device-unusable",
        "restart-plugin",
        "atomic-replacement",
        "preservation",
        "cleanup",
    }


def test_the_same_runs_swapped_turn_each_change_around() -> None:
    found = rows(view(GO, OURS))
    assert found["cdi-stale"].kind == "regression" and found["cdi-missing"].kind == "fixed"
    assert found["registration-failure"].kind == "gained"
    assert found["registration-dir-replaced"].kind == "lost"
    crash = next(f for f in found["restart-kubelet"].figures if f.name.endswith("crash_s"))
    assert crash.faster and not crash.slower and crash.note == "faster"


def test_union_of_ids_in_catalogue_order() -> None:
    ids = [r.id for r in view().rows]
    assert ids.index("registration-failure") + 1 == ids.index("registration-dir-replaced")
    assert ids[0] == "guest-execution" and ids[-1] == "cleanup" and len(ids) == len(set(ids)) == 15
    # An id only B has follows the id B ran before it (or leads, when B ran it first).
    assert cm.merged_ids(["a", "c", "e"], ["b", "c", "d", "f"]) == ["b", "a", "c", "d", "f", "e"]
    assert cm.merged_ids(["a", "b"], []) == ["a", "b"] and cm.merged_ids([], ["x"]) == ["x"]


def test_the_floor_keeps_noise_on_tiny_figures_out() -> None:
    # device-unusable recovery: 2.2 ms -> 6.1 ms is 2.77x, but only 3.9 ms longer.
    recovery = next(f for f in rows(view())["device-unusable"].figures if f.name == "recovery_s")
    assert recovery.ratio is not None and recovery.ratio > 2.7 and not recovery.slower
    strict = rows(view(threshold=1.1, floor_s=0.0))
    assert any(f.name == "recovery_s" for f in strict["device-unusable"].slower)
    assert any(f.name == "recovery_s" for f in strict["restart-plugin"].slower)  # 1.24x
    assert not strict["restart-plugin"].figures[1].slower  # guest_counter: a count, not judged


@pytest.mark.parametrize(
    ("a", "b", "fail", "expected"),
    [(OURS, GO, False, 0), (OURS, GO, True, 1), (GO, OURS, True, 1), (OURS, OURS, True, 0)],
)
def test_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], a: Path, b: Path, fail: bool, expected: int
) -> None:
    argv = [str(a), str(b / "results.json"), "--out", str(tmp_path / "out")]
    assert main([*argv, "--fail-on-regression"] if fail else argv) == expected
    assert (tmp_path / "out" / "compare.md").read_text().startswith("# hvconform compare: ")
    assert (tmp_path / "out" / "compare.html").read_text().startswith("<!doctype html>")
    said = capsys.readouterr().out
    assert ("NO REGRESSION" in said) == (a == b)


def test_markdown_to_stdout_without_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(OURS), str(GO)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# hvconform compare: hv-device-plugin vs go-kvm\n")
    assert "**Verdict: REGRESSION: 1 check newly failed, 1 figure slower.**" in text


def test_the_suite_cli_knows_compare(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as help_exit:
        cli.main(["compare", "--help"])
    assert help_exit.value.code == 0
    taught = capsys.readouterr().out
    for words in ("--fail-on-regression", "--threshold", "--floor-ms", "Regression", "examples:"):
        assert words in taught
    assert cli.main(["compare", str(OURS), str(OURS), "--fail-on-regression"]) == 0


def test_labels_default_to_profile_then_run_id(tmp_path: Path) -> None:
    data = json.loads((GO / "results.json").read_text())
    del data["run"]["plugin"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    v = view(OURS, tmp_path)
    assert (v.a.label, v.b.label) == ("hv-device-plugin", "20261202T170511Z-20871")
    same = view(OURS, OURS)
    assert same.a.label != same.b.label and same.a.label.startswith("A: ")
    named = compare(load(str(OURS)), load(str(GO)), PAIR, labels=("main", "PR 7"))
    assert named.title == "hvconform compare: main vs PR 7"


def _hostile(tmp_path: Path) -> Path:
    data = json.loads((GO / "results.json").read_text())
    data["run"]["plugin"]["name"] = "go|kvm <i>x</i> [a](javascript:b) *y* `z`\x1b[2J"
    only_b = next(c for c in data["checks"] if c["id"] == "registration-dir-replaced")
    only_b["title"] = "Stale | <img src=x onerror=alert(1)>\u202e"
    run = tmp_path / "run (1) <weird> #x"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(data))
    return run


def test_every_input_value_is_escaped_for_markdown(tmp_path: Path) -> None:
    text = render_markdown(compare(load(str(OURS)), load(str(_hostile(tmp_path))), tmp_path))
    assert "\x1b" not in text and "\u202e" not in text and "␛\\[2J" in text
    row = next(line for line in text.splitlines() if line.startswith("| Plugin profile"))
    cells = row.strip("| ").split(" | ")
    assert len(cells) == 3 and not re.search(r"(?<!\\)[<>`*\[\]|]", cells[2]), cells
    assert "<i>" not in text and "<img" not in text and not re.search(r"(?<!\\)\]\(java", text)
    assert "go\\|kvm &lt;i&gt;x&lt;/i&gt; \\[a\\](javascript:b) \\*y\\* \\`z\\`" in text
    table = text.split("## Results\n", 1)[1].split("\n## ", 1)[0].strip().splitlines()
    assert len(table) == 2 + 15 and any(line.startswith("| Stale \\| &lt;img") for line in table)
    assert all(line.count(" | ") == 3 for line in table), "a value broke the table"
    assert "(run%20%281%29%20%3Cweird%3E%20%23x/results.json)" in text


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "No such file"),
        ("{not json", "not JSON"),
        (b"\xff\xfe{}", "a binary file"),
        ('{"schema_version": "1.0"}', "does not follow the results schema"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
        ('{"a":' * 70 + "1" + "}" * 70, "nested deeper than 64 levels"),
        ("NaN", "NaN is not a number JSON allows"),
    ],
    ids=["missing", "not-json", "not-utf8", "schema", "deep", "deeper-than-limit", "nan"],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None, said: str
) -> None:
    bad = tmp_path / "results.json"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    elif content is not None:
        bad.write_text(content)
    for argv in ([str(OURS), str(bad)], [str(tmp_path), str(GO)]):
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hvconform compare: ") and err.count("\n") == 1, err
        assert said in err and "Traceback" not in err
    assert not (tmp_path / "out").exists(), "nothing is written for bad input"


def test_a_metric_that_is_not_finite_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        (GO / "results.json")
        .read_text()
        .replace('"recovery_s": 3.104277', '"recovery_s": Infinity')
    )
    (tmp_path / "results.json").write_text(text)
    assert main([str(OURS), str(tmp_path)]) == 2
    assert "Infinity is not a number JSON allows" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--threshold", "1"], "--threshold: a number above 1"),
        (["--threshold", "nan"], "--threshold: a number above 1"),
        (["--floor-ms", "-1"], "--floor-ms: a number at least 0"),
        (["--label-a", "a\nb"], "--label-a: one line"),
        (["--label-b", ""], "--label-b: one line"),
        (["--label-b", "x\x1b"], "--label-b: one line"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], said: str
) -> None:
    assert main([str(OURS), str(GO), "--out", str(tmp_path / "out"), *option]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert main([str(OURS), str(GO), "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_links_reach_each_runs_files(tmp_path: Path) -> None:
    for run in (OURS, GO):
        shutil.copytree(run, tmp_path / run.name)
    (tmp_path / "go-kvm" / "report.html").write_text("<!doctype html>")
    out = tmp_path / "out"
    assert main([str(tmp_path / "ours"), str(tmp_path / "go-kvm"), "--out", str(out)]) == 0
    text = (out / "compare.md").read_text()
    assert "[results.json](../ours/results.json) |" in text
    assert "[results.json](../go-kvm/results.json), [report.html](../go-kvm/report.html) |" in text
    assert (out / "../go-kvm/report.html").is_file()
