"""Every metric the running plugin exposes follows the Prometheus naming rules, and
hv_plugin_build_info says which build runs. Scraped from the real /metrics of a plugin that
registered and answered an Allocate, so the labelled series exist."""

from __future__ import annotations

import platform
import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from hv_device_plugin.version import source_commit, version
from tests.plugin.plugin_process import PluginProcess, Stream, wait_for

METRIC_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # no colons: those are for recording rules
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Base units only (seconds, bytes, ratios): no milliseconds, kilobytes, minutes, percentages.
NON_BASE_UNIT = re.compile(
    r"_(milli|micro|nano)?(ms|us|ns|millis|milliseconds|microseconds|minutes|hours|days|"
    r"kb|mb|gb|kilobytes|megabytes|percent)(_|$)"
)
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def scrape(plugin: PluginProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{plugin.port}/metrics", timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        return str(r.read().decode())


def naming_problems(text: str) -> list[str]:
    """Every broken rule in an exposition, one line each (empty: all names are good)."""
    problems = []
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    if len(names) != len(set(names)):
        problems.append(f"duplicate families: {sorted(names)}")
    for family in families:
        name, kind = family.name, family.type
        if not METRIC_NAME.fullmatch(name):
            problems.append(f"{name}: not a valid metric name")
        if not family.documentation.strip():
            problems.append(f"{name}: no HELP text")
        if NON_BASE_UNIT.search(name):
            problems.append(f"{name}: not in a base unit")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{name}: _total on a {kind}")
        if name.endswith("_info") and kind not in ("gauge", "info"):
            problems.append(f"{name}: _info on a {kind}")
        for sample in family.samples:
            problems += _sample_problems(name, kind, sample)
    return problems + _raw_counter_problems(text)


def _raw_counter_problems(text: str) -> list[str]:
    """Counter samples as written (the parser adds a missing _total itself, hiding it)."""
    problems, kind = [], ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            kind = line.split()[3]
        elif line and not line.startswith("#"):
            sample = re.split(r"[{ ]", line, maxsplit=1)[0]
            if kind == "counter" and not sample.endswith(("_total", "_created")):
                problems.append(f"{sample}: a counter sample must end in _total")
    return problems


def _sample_problems(name: str, kind: str, sample: Sample) -> list[str]:
    problems = []
    allowed = SUFFIXES.get(kind, ("",))
    if not any(sample.name == name + suffix for suffix in allowed):
        problems.append(f"{sample.name}: a {kind} sample must be {name}{{{','.join(allowed)}}}")
    for label in sample.labels:
        if not LABEL_NAME.fullmatch(label) or label.startswith("__"):
            problems.append(f"{sample.name}: bad label name {label!r}")
    if name.endswith("_info") and sample.value != 1:
        problems.append(f"{sample.name}: an info gauge is always 1, not {sample.value}")
    return problems


def test_every_exposed_metric_follows_the_naming_rules(plugin: PluginProcess) -> None:
    stream = Stream(plugin.socket())  # readiness needs an open ListAndWatch stream
    try:
        wait_for(plugin.ready, 20, "plugin ready")
        wait_for(lambda: stream.snapshots, 10, "the device list")
        plugin.allocate(stream.snapshots[-1][0][0])  # labelled series of counters, histogram
        text = scrape(plugin)
    finally:
        stream.cancel()
    assert naming_problems(text) == []
    ours = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("hv_")}
    assert all(n.startswith("hv_plugin_") for n in ours), ours
    assert {
        "hv_plugin_build_info",
        "hv_plugin_allocations",  # the family of hv_plugin_allocations_total
        "hv_plugin_registrations",
        "hv_plugin_probe_duration_seconds",
        "hv_plugin_ready",
    } <= ours


def test_build_info_names_the_running_build(plugin: PluginProcess) -> None:
    (family,) = [
        f
        for f in text_string_to_metric_families(scrape(plugin))
        if f.name == "hv_plugin_build_info"
    ]
    assert family.type == "gauge"
    (sample,) = family.samples
    assert sample.value == 1
    assert sample.labels == {
        "version": version(),
        "commit": source_commit(),
        "python": platform.python_version(),
    }


def test_the_checker_is_not_blind() -> None:
    """Each rule objects to a name that breaks it."""
    bad = (
        "# HELP hv_plugin_latency_ms Latency\n# TYPE hv_plugin_latency_ms gauge\n"
        "hv_plugin_latency_ms 3\n"
        "# HELP hv_plugin_open_total Open\n# TYPE hv_plugin_open_total gauge\n"
        "hv_plugin_open_total 1\n"
        "# HELP hv_plugin_x_info X\n# TYPE hv_plugin_x_info gauge\n"
        "hv_plugin_x_info 2\n"
        "# HELP hv_plugin_calls Calls\n# TYPE hv_plugin_calls counter\n"
        "hv_plugin_calls 1\n"
    )
    found = "\n".join(naming_problems(bad))
    for expected in ("not in a base unit", "_total on a gauge", "always 1",
                     "a counter sample must end in _total"):  # fmt: skip
        assert expected in found, found
    # Label names the text parser would accept, but the naming rules reserve.
    reserved = Sample("hv_plugin_x", {"__reserved": "1"}, 1.0)
    assert "bad label name" in "\n".join(_sample_problems("hv_plugin_x", "gauge", reserved))
