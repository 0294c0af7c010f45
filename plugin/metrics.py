"""Prometheus metrics of the plugin (exposed at /metrics), in the text exposition format 0.0.4.

Written here rather than with prometheus_client: the plugin needs counters, gauges and one
histogram, all updated on the event loop, and the client library (with the http.server and
email modules it pulls in) was a quarter of the plugin's start-up time and several MiB resident.
The standard process_* series are kept, read from /proc/self at scrape time.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hv_device_plugin.version import source_commit, version

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

LabelValues = tuple[str, ...]


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(text: str, quotes: bool = False) -> str:
    """Backslash and newline escaped, as HELP text needs; label values escape quotes too."""
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if quotes else text


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return (
        "{"
        + ",".join(f'{n}="{_escape(v, quotes=True)}"' for n, v in zip(names, values, strict=True))
        + "}"
    )


class _Family:
    """One metric family: its name, help, type and label names; children keyed by labels."""

    kind = ""
    suffix = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        _REGISTRY.append(self)

    def _key(self, values: dict[str, str]) -> LabelValues:
        if set(values) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(values)} != {list(self.labelnames)}")
        return tuple(str(values[n]) for n in self.labelnames)

    def header(self) -> Iterator[str]:
        doc = _escape(self.documentation)
        # Named as the samples are (a counter's with _total), as the 0.0.4 parsers expect.
        name = self.name + (self.suffix if self.kind == "counter" else "")
        yield f"# HELP {name} {doc}"
        yield f"# TYPE {name} {self.kind}"

    def samples(self) -> Iterator[str]:
        raise NotImplementedError


class _Value:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Scalar(_Family):
    """Counter or gauge: one value per label set (the unlabelled one exists from the start)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, documentation, labelnames)
        self._children: dict[LabelValues, _Value] = {} if labelnames else {(): _Value()}

    def labels(self, **values: str) -> _Value:
        return self._children.setdefault(self._key(values), _Value())

    def inc(self, amount: float = 1.0) -> None:
        self._children[()].inc(amount)

    def set(self, value: float) -> None:
        self._children[()].set(value)

    def samples(self) -> Iterator[str]:
        for key, child in self._children.items():
            yield f"{self.name}{self.suffix}{_labels(self.labelnames, key)} {_number(child.value)}"


class Counter(_Scalar):
    kind, suffix = "counter", "_total"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames)


class Gauge(_Scalar):
    kind = "gauge"


class _Buckets:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1


class Histogram(_Family):
    kind = "histogram"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self._bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        self._children: dict[LabelValues, _Buckets] = {}

    def labels(self, **values: str) -> _Buckets:
        return self._children.setdefault(self._key(values), _Buckets(self._bounds))

    def samples(self) -> Iterator[str]:
        for key, child in self._children.items():
            cumulative = 0
            for bound, count in zip([*self._bounds, math.inf], child.counts, strict=True):
                cumulative += count
                names, values = (*self.labelnames, "le"), (*key, _number(bound))
                yield f"{self.name}_bucket{_labels(names, values)} {_number(cumulative)}"
            yield f"{self.name}_count{_labels(self.labelnames, key)} {_number(cumulative)}"
            yield f"{self.name}_sum{_labels(self.labelnames, key)} {_number(child.total)}"


_REGISTRY: list[_Family] = []


def _process() -> Iterator[str]:
    """The standard process_* series of this process, from /proc/self (Linux only)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        fds = sum(1 for _ in Path("/proc/self/fd").iterdir())
    except (OSError, StopIteration, IndexError, ValueError):
        return
    # Fields after the command name, counted from 3: utime 14, stime 15, starttime 22, rss 24.
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    series = (
        ("process_cpu_seconds_total", "counter", "Total user and system CPU time in seconds", cpu),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes",
         int(fields[21]) * _PAGE),
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes", int(fields[20])),
        ("process_start_time_seconds", "gauge", "Start time since the epoch in seconds",
         btime + int(fields[19]) / _CLK_TCK),
        ("process_open_fds", "gauge", "Number of open file descriptors", fds),
    )  # fmt: skip
    for name, kind, doc, value in series:
        yield from (f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {_number(value)}")


def exposition() -> bytes:
    """Every family of this process, in the text format (CONTENT_TYPE)."""
    lines: list[str] = []
    for family in _REGISTRY:
        lines += [*family.header(), *family.samples()]
    lines += _process()
    return ("\n".join(lines) + "\n").encode()


def python_version() -> str:
    """platform.python_version() without importing platform (start-up time)."""
    major, minor, micro = sys.version_info[:3]
    return f"{major}.{minor}.{micro}"


# Which build is running, as the conventional *_build_info gauge: always 1, the facts in labels
# (joined onto other series with `* on(instance) group_left(version)`). Set once, at import: the
# commit is read from git's files in a checkout, which must not happen inside a scrape.
BUILD_INFO = Gauge(
    "hv_plugin_build_info",
    "Version, source commit and Python version of the running plugin (always 1)",
    ["version", "commit", "python"],
)
BUILD_INFO.labels(version=version(), commit=source_commit(), python=python_version()).set(1)

REGISTRATIONS = Counter(
    "hv_plugin_registrations_total", "Register calls to the kubelet by result", ["result"]
)
HEALTH_TRANSITIONS = Counter(
    "hv_plugin_health_transitions_total", "Advertised device health transitions", ["to"]
)
CDI_REPAIRS = Counter("hv_plugin_cdi_repairs_total", "CDI spec repairs by cause", ["cause"])
CDI_FAILURES = Counter(
    "hv_plugin_cdi_failures_total", "CDI checks that could not repair", ["state"]
)
PROBE_SECONDS = Histogram(
    "hv_plugin_probe_duration_seconds",
    "Device check duration (identity and usability)",
    ["result"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)
ALLOCATIONS = Counter("hv_plugin_allocations_total", "Allocate calls by result", ["result"])
READY = Gauge("hv_plugin_ready", "1 when the plugin is ready")
HEALTHY = Gauge("hv_plugin_devices_healthy", "1 when devices are advertised Healthy")
STREAMS = Gauge("hv_plugin_list_and_watch_streams", "Open ListAndWatch streams")
