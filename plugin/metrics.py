"""Prometheus metrics of the plugin (exposed at /metrics)."""

from __future__ import annotations

import platform

from prometheus_client import Counter, Gauge, Histogram

from plugin.version import source_commit, version

# Which build is running, as the conventional *_build_info gauge: always 1, the facts in labels
# (joined onto other series with `* on(instance) group_left(version)`). Set once, at import: the
# commit may ask git (in a checkout), which must not happen inside a scrape.
BUILD_INFO = Gauge(
    "hv_plugin_build_info",
    "Version, source commit and Python version of the running plugin (always 1)",
    ["version", "commit", "python"],
)
BUILD_INFO.labels(version=version(), commit=source_commit(), python=platform.python_version()).set(
    1
)

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
