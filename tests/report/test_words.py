"""Figures in words and the inline SVG: what a reader sees of each measured number."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from hvconform.report import legacy, svg, words
from hvconform.report.model import CheckView, Event


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.0000031, "3 µs"),
        (0.0031, "3.1 ms"),
        (0.014, "14 ms"),
        (0.0956, "96 ms"),
        (0.21, "0.21 s"),
        (2.4966, "2.50 s"),
        (22.34, "22.3 s"),
        (65, "1 min 5 s"),
        (120, "2 min"),
    ],
)
def test_durations(seconds: float, said: str) -> None:
    assert words.duration(seconds) == said


def test_the_seeds_phrases() -> None:
    assert words.figures({"recovery_s": 0.21}) == ["recovered in 0.21 s"]
    graceful_and_crash = {
        "reregistration_graceful_s": 0.011,
        "reregistration_crash_s": 0.014,
        "reregistration_s": 0.014,  # the overall figure repeats one of the two: said once
    }
    assert words.figures(graceful_and_crash) == [
        "re-registered in 11 ms after a graceful restart",
        "re-registered in 14 ms after a crash restart",
    ]
    storm = {"reads": 40383, "torn_reads": 0, "read_errors": 0}
    assert words.figures(storm) == ["40,383 reads, 0 torn, 0 errors"]


def test_unknown_metrics_are_shown_not_dropped() -> None:
    assert words.figures({"widgets_s": 1.5, "colour": "blue"}) == [
        "colour: blue",
        "widgets s: 1.50 s",
    ]


def old(reason: str) -> legacy.Recovered:
    return legacy.read_pre_1_3_check({"status": "failed", "reason": reason})


def test_pre_1_3_reasons_name_the_wait_or_the_error() -> None:
    """Results written before 1.3 (here, before 1.2) carry the wait only in its message."""
    wait = (
        "hvconform.contract.wait.WaitExpired: "
        "wait 'plugin readiness (x)' expired after 60s (last: False)"
    )
    found = old(wait)
    assert found.wait is not None and found.failure == "wait"
    assert (found.wait.awaited, found.wait.after, found.wait.last) == (
        "plugin readiness (x)",
        "60 s",
        "False",
    )
    assert found.said == "waited 60 s for plugin readiness (x): the condition still did not hold"
    assert (old("AssertionError: 3 torn reads").said, old("3 torn reads").failure) == (
        "3 torn reads",
        "assertion",
    )
    # no Python class name reaches a reason
    broke = old("RuntimeError: boom")
    assert (broke.said, broke.failure) == ("the check could not go on: boom", "error")


def test_typed_wait_fields_become_a_sentence() -> None:
    """Schema 1.2: the expired wait's typed fields, not its message, make the words."""
    from hvconform.contract.wait import expired

    facts = expired("allocatable > 0 (after restore)", 60, False).facts
    assert facts is not None
    fields = facts.to_json()
    assert fields["view"] == "kubelet" and fields["last"] == "False"
    assert words.wait_sentence(fields) == (
        "waited 60 s for allocatable > 0 (after restore) (as the kubelet sees it): "
        "the kubelet still counted 0 allocatable"
    )
    shown = words.Wait.of(fields)
    assert (shown.view, shown.after, shown.seen) == (
        "the kubelet's",
        "1 min",
        "the kubelet still counted 0 allocatable",
    )
    assert words.sentence("passed", "", []) == "Passed."
    assert words.sentence("not_applicable", "no crash restart", []) == (
        "Not applicable. No crash restart."
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("missing spec injected", "fault"),
        ("directory placed at spec path", "fault"),
        ("device removed from host view", "fault"),
        ("plugin socket dir replaced by an empty dir", "fault"),
        ("kubelet back after crash restart", "fault"),
        ("read-only CDI storage, spec missing", "fault"),
        ("unready and allocatable 0", "detected"),
        ("readiness false", "detected"),
        ("allocation refused", "detected"),
        ("not ready", "detected"),
        ("spec byte-exact", "repaired"),
        ("obstruction removed", "repaired"),
        ("device mapping restored", "repaired"),
        ("plugin re-registered (graceful)", "repaired"),
        ("ready (after repair)", "ready"),
        ("fresh guest passed (kubelet crash restart)", "guest"),
        ("storm stopped", "info"),
    ],
)
def test_pre_1_3_event_kinds_from_the_scenarios_wording(name: str, kind: str) -> None:
    found = legacy.read_pre_1_3_check({"timeline": [{"name": name, "t_s": 0.0}]})
    assert found.kinds == [kind]


def check(status: str = "passed", reason: str = "", wait: words.Wait | None = None) -> CheckView:
    timeline = [
        Event("ready (before fault)", 0.001, "ready"),
        Event("missing <spec> injected", 0.002, "fault"),
        Event("spec byte-exact", 0.005, "repaired"),
        Event("ready (after repair)", 0.007, "ready"),
    ]
    metrics: dict[str, words.Metric] = {"recovery_s": 0.003}
    return CheckView(
        "cdi-missing", "cdi", "Missing", status, reason, 1.0, metrics, [], timeline, [], wait=wait
    )


def elements(text: str) -> ET.Element:
    return ET.fromstring(text)  # noqa: S314 (our own SVG: it must be well-formed XML)


def test_timeline_draws_every_event_and_the_outage() -> None:
    root = elements(svg.timeline(check()))
    ns = "{http://www.w3.org/2000/svg}"
    assert root.get("data-check") == "cdi-missing"
    assert len(root.findall(f".//{ns}circle")) == 4
    assert len(root.findall(f"{ns}rect[@class='outage']")) == 1
    labels = [t.text for t in root.iter(f"{ns}text") if t.get("class") == "label"]
    assert "missing <spec> injected" in labels  # escaped in the source, intact when parsed


def test_a_failed_timeline_ends_in_the_failure() -> None:
    from hvconform.contract.wait import expired

    facts = expired("spec again", 3, None).facts
    assert facts is not None
    wait = words.Wait.of(facts.to_json())
    root = elements(svg.timeline(check("failed", facts.sentence(), wait)))
    ns = "{http://www.w3.org/2000/svg}"
    failed = [t.text for t in root.iter(f"{ns}text") if "failed" in str(t.get("class"))]
    assert failed == ["failed: spec again"]


def test_recovery_chart_has_a_bar_per_measured_check() -> None:
    slow = check()
    slow.id, slow.metrics = "restart-plugin", {"recovery_s": 2.5}
    unmeasured = check()
    unmeasured.id, unmeasured.metrics = "preservation", {}
    root = elements(svg.recovery_chart([check(), slow, unmeasured]))
    bars = root.findall(".//{http://www.w3.org/2000/svg}rect[@class='bar']")
    assert len(bars) == 2
    assert float(str(bars[0].get("width"))) >= 2.0  # 3 ms next to 2.5 s: still visible
    assert svg.recovery_chart([unmeasured]) == ""


def test_the_plugins_own_reaction_reads_before_the_kubelets() -> None:
    text = words.figures(
        {"detected_s": 0.95, "plugin_detected_s": 0.004, "plugin_recovery_s": 0.01}
    )
    assert text[:2] == ["plugin unready 4.0 ms after the fault", "detected in 0.95 s"], text
    assert "plugin ready 10 ms after the fault was undone" in text
