"""tools/verdict_matrix.py, the before/after matrix of issue 37: the verdicts read from every
results.json of a run (a pool run writes one per node), the table, and the comparison that
names each cell that changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import verdict_matrix as vm


def _results(path: Path, **statuses: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    checks = [
        {"id": c.replace("_", "-"), "status": s, "reason": "" if s == "passed" else f"why {c}"}
        for c, s in statuses.items()
    ]
    (path / "results.json").write_text(json.dumps({"checks": checks}))


def test_a_check_the_nodes_judged_differently_shows_each_node(tmp_path: Path) -> None:
    _results(tmp_path / "n1", cdi_exact="passed", cleanup="passed")
    _results(tmp_path / "n2", cdi_exact="failed", cleanup="passed")
    status, reasons, files = vm.verdicts(tmp_path)
    assert status == {"cdi-exact": "passed / n2=failed", "cleanup": "passed"}
    assert reasons == {"cdi-exact": "why cdi_exact"} and len(files) == 2


def test_compare_names_each_changed_cell_and_counts_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {"matrix": {"ours": {"node": {"a": "passed", "cleanup": "failed"}}}}
    after = {"matrix": {"ours": {"node": {"a": "passed", "cleanup": "passed"}}}}
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    assert vm.main(["compare", str(tmp_path / "b.json"), str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["ours node cleanup: failed -> passed", "1 cells equal"]


def test_the_table_has_a_row_per_check_and_a_column_per_target() -> None:
    run = {"exit": 0, "suite_exit": 0, "seconds": 90.0, "timed_out": False}
    data = {
        "checkout": "/c",
        "commit": "0123456789abcdef",
        "matrix": {"go-kvm": {"local": {"b": "passed"}, "kind": {"a": "not_applicable"}}},
        "runs": {"go-kvm": {"local": run, "kind": run}},
    }
    text = vm.markdown(data)
    assert "| check | local | kind |" in text
    assert "| a | - | not_applicable |" in text and "| b | passed | - |" in text
    assert "- kind: exit 0 (suite 0), 1.5 min" in text


def test_unknown_names_are_refused() -> None:
    with pytest.raises(SystemExit):
        vm.main(["run", "--checkout", ".", "--out", "x", "--targets", "mars"])
