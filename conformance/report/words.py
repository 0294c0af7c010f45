"""Measured figures in words: durations, counts and one sentence per check.

The wording is driven by metric names, not check ids, so a new check that records `recovery_s`
or `reads` reads well without touching this module; unknown metrics are still shown, formatted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvconform.contract import wait as waits

Metric = float | int | str


def duration(seconds: float) -> str:
    """0.0031 -> '3.1 ms', 0.014 -> '14 ms', 0.21 -> '0.21 s', 22.34 -> '22.3 s', 65 -> '1 min 5 s'."""
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 0.0995:
        ms = seconds * 1000
        return f"{ms:.1f} ms" if ms < 9.95 else f"{ms:.0f} ms"
    if seconds < 9.995:
        return f"{seconds:.2f} s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def count(value: Metric) -> str:
    """Integers with thousands separators (40,383); anything else as given."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,}"


def value(name: str, raw: Metric) -> str:
    """One metric value in words: seconds for *_s names, shares as percent, counts otherwise."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        if name.endswith("_s"):
            return duration(float(raw))
        if name.endswith("_share"):
            return f"{raw * 100:.1f} %"
    return count(raw)


_VIEWS = {
    "kubelet": "the kubelet's",
    "plugin": "the plugin's own",
    "API": "the API server's",
    "emulator": "the kubelet emulator's",
}


@dataclass(frozen=True)
class Wait:
    """An expired wait as the report shows it: what, whose view, how long, what was seen."""

    awaited: str
    view: str  # "the kubelet's", ... ("" when the results do not say)
    after: str  # "60 s"
    seen: str  # the last value in words
    last: str  # the last value as recorded ("" when none)
    sentence: str  # the whole wait in one sentence, as the failure's reason reads

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Wait:
        """From a check record's typed `wait` fields (results schema 1.2)."""
        timeout = fields.get("timeout_s", 0)
        after = duration(float(timeout)) if isinstance(timeout, int | float) else str(timeout)
        return cls(
            str(fields.get("awaited", "")),
            _VIEWS.get(str(fields.get("view", "")), ""),
            after,
            str(fields.get("seen", "")),
            str(fields.get("last", "")),
            wait_sentence(fields),
        )


def wait_sentence(fields: Mapping[str, Any]) -> str:
    """The typed fields of an expired wait in one sentence (hvconform.contract.wait words)."""
    timeout = fields.get("timeout_s", 0)
    return waits.sentence(
        str(fields.get("awaited", "")),
        str(fields.get("view", "")),
        float(timeout) if isinstance(timeout, int | float) else 0.0,
        str(fields.get("seen", "")),
    )


def _seconds(metrics: Mapping[str, Metric], name: str) -> float | None:
    raw = metrics.get(name)
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    return None


def _timing_phrases(metrics: Mapping[str, Metric], used: set[str]) -> list[str]:
    """Detection, recovery and re-registration times in the order a reader follows a fault."""
    phrases: list[str] = []
    templates = (
        ("plugin_detected_s", "plugin unready {} after the fault"),
        ("detected_s", "detected in {}"),
        ("refused_s", "allocation refused {} after the fault"),
        ("plugin_recovery_s", "plugin ready {} after the fault was undone"),
        ("recovery_s", "recovered in {}"),
        ("ready_again_s", "ready again {} after the fault"),
        ("reregistration_graceful_s", "re-registered in {} after a graceful restart"),
        ("reregistration_crash_s", "re-registered in {} after a crash restart"),
        ("boot_to_registered_s", "plugin registered {} after the kubelet started"),
        ("usable_to_ready_s", "ready {} after the device became usable"),
        ("workload_back_s", "the controller's workload ran again {} after it was usable"),
    )
    for name, template in templates:
        seconds = _seconds(metrics, name)
        if seconds is not None:
            phrases.append(template.format(duration(seconds)))
            used.add(name)
    seconds = _seconds(metrics, "reregistration_s")
    if seconds is not None:
        used.add("reregistration_s")
        # The overall figure repeats the graceful/crash ones when those are present.
        if not {"reregistration_graceful_s", "reregistration_crash_s"} & used:
            phrases.append(f"re-registered in {duration(seconds)}")
    return phrases


def _storm_phrases(metrics: Mapping[str, Metric], used: set[str]) -> list[str]:
    phrases: list[str] = []
    if "reads" in metrics:
        torn = metrics.get("torn_reads", "?")
        errors = metrics.get("read_errors", "?")
        phrases.append(
            f"{count(metrics['reads'])} reads, {count(torn)} torn, {count(errors)} errors"
        )
        used.update({"reads", "torn_reads", "read_errors"})
    first = _seconds(metrics, "first_repair_s")
    if first is not None:
        text = f"allocation-triggered repair seen in {duration(first)}"
        cycles = metrics.get("cycles")
        worst = _seconds(metrics, "first_repair_max_s")
        if cycles is not None:
            text += f" (median of {count(cycles)} cycles"
            text += f", slowest {duration(worst)})" if worst is not None else ")"
            used.update({"cycles", "first_repair_max_s"})
        phrases.append(text)
        used.add("first_repair_s")
    return phrases


def plural(n: Metric, one: str, many: str) -> str:
    """'1 survivor', '0 survivors', '40,383 reads'."""
    return f"{count(n)} {one if n == 1 else many}"


def _state_phrases(metrics: Mapping[str, Metric], used: set[str]) -> list[str]:
    nouns = (
        ("runs", "guest run passed", "guest runs passed"),
        ("sentinels", "sentinel file unchanged", "sentinel files unchanged"),
        ("ledger_entries", "ledger entry", "ledger entries"),
        ("survivors", "survivor", "survivors"),
        ("nodes", "node checked", "nodes checked"),
        ("read_backs", "read-back of the running plugin", "read-backs of the running plugin"),
        ("pods_kept_graceful", "pod kept by a graceful restart", "pods kept by a graceful restart"),
        ("pods_kept_crash", "pod kept by a crash restart", "pods kept by a crash restart"),
        ("refused_before_registered", "request refused before registration",
         "requests refused before registration"),
        ("refused_while_unusable", "request refused while unusable",
         "requests refused while unusable"),
        ("admission_errors_at_boot", "admission error at boot", "admission errors at boot"),
    )  # fmt: skip
    states = (
        ("guest_counter", "the running guest kept counting (reached {})"),
        ("session_guest_counter", "the session guest kept its state (counter {})"),
    )
    phrases = [template.format(count(metrics[k])) for k, template in states if k in metrics]
    phrases += [plural(metrics[k], one, many) for k, one, many in nouns if k in metrics]
    used.update(k for k, _ in states)
    used.update(k for k, _, _ in nouns)
    if "registered_while_absent" in metrics:  # device-late: either way is right
        absent = metrics["registered_while_absent"]
        phrases.append("registered unhealthy while absent" if absent else "waited to register")
        used.add("registered_while_absent")
    share = metrics.get("retry_cpu_share")
    if isinstance(share, int | float):
        phrases.append(f"registration retries used {share * 100:.1f} % of a CPU")
        used.add("retry_cpu_share")
    return phrases


# Figures that add nothing to a one-line verdict; they stay in the HTML's full metrics table.
_QUIET = frozenset({"allocate_answered_s", "cdi_device"})


def figures(metrics: Mapping[str, Metric], fresh: int = 0) -> list[str]:
    """Every measured figure of a check as short phrases, the known ones first; `fresh` is how
    many fresh guests passed (the timeline's events of kind guest)."""
    used: set[str] = set()
    phrases = _timing_phrases(metrics, used) + _storm_phrases(metrics, used)
    phrases += _state_phrases(metrics, used)
    if fresh == 1:
        phrases.append("a fresh guest passed afterwards")
    elif fresh > 1:
        phrases.append(f"a fresh guest passed after each of {fresh} faults")
    for name in sorted(set(metrics) - used - _QUIET):
        phrases.append(f"{name.replace('_', ' ')}: {value(name, metrics[name])}")
    return phrases


STATUS_WORDS = {
    "passed": "Passed",
    "failed": "FAILED",
    "skipped": "Skipped",
    "not_applicable": "Not applicable",
    "environment_blocked": "Environment blocked",
    "blocked": "Blocked",
    "not_run": "Not run",
}


def detail(status: str, said: str, phrases: Sequence[str]) -> str:
    """The Result cell after the status word: the reason in words (when not passed), then the
    figures."""
    parts = []
    if status != "passed" and said:
        parts.append(capital(said).rstrip(".") + ".")
    if phrases:
        parts.append(capital("; ".join(phrases)) + ".")
    return " ".join(parts)


def sentence(status: str, said: str, phrases: Sequence[str]) -> str:
    """The whole Result cell: 'Passed. Recovered in 3.1 ms; ...'."""
    head = STATUS_WORDS.get(status, status) + "."
    rest = detail(status, said, phrases)
    return f"{head} {rest}" if rest else head


def capital(text: str) -> str:
    return text[:1].upper() + text[1:]
