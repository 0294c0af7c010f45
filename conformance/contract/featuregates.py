"""The feature gates a run's environment names: those the target set, and what the cluster's
components say is enabled.

Every Kubernetes component (API server, kubelet, ...) records each gate it knows as the gauge
`kubernetes_feature_enabled{name="X",stage="Y"} 1|0` on its /metrics (k8s.io/component-base
metrics/prometheus/feature, set by FeatureGate.AddMetrics at start; stage "" is GA). Both target
families read it (the node target from its loopback API server, the cluster family through its
kubeconfig and the node proxy), so the parsing and the file they write are defined here once.
A component whose gates cannot be read is recorded with the reason: it never fails a run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvconform.contract.results import FEATURE_GATES_FILE
from hvconform.contract.safewrite import write_atomic

# The gates that decide what DRA and device health can do on a node: the names they start with.
GATES_REPORTED = ("DRA", "DynamicResourceAllocation", "ResourceHealthStatus", "KubeletPodResources")
METRIC = "kubernetes_feature_enabled"

# The keys of FEATURE_GATES_FILE (results.json's environment.feature_gates), read by the report.
SET_BY_TARGET = "set_by_target"  # name -> bool as the target set it ({}: defaults), or unread
API_SERVER = "api_server"  # name -> "on (STAGE)" / "off (STAGE)", or {UNREAD: why}
KUBELET = "kubelet"  # the same, from the kubelet of the node under test
KUBELET_NODE = "kubelet_node"  # which node that kubelet runs on
UNREAD = "unread"

# One sample of the Prometheus text format: NAME{LABELS} VALUE [TIMESTAMP]. Labels are matched
# one by one, so their order and any label added later do not matter.
_SAMPLE = re.compile(rf"^{METRIC}\{{(?P<labels>[^}}]*)\}}[ \t]+(?P<value>\S+)", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_MAX_REASON = 200


class NoGateMetric(ValueError):
    """The text holds no sample of METRIC: not a component's /metrics, or one that hides it."""


def enabled(text: str, prefixes: tuple[str, ...] = GATES_REPORTED) -> dict[str, str]:
    """What a component's /metrics text says of the gates whose names start with `prefixes`:
    name -> "on (STAGE)" or "off (STAGE)", sorted by name. Raises NoGateMetric when the text has
    no sample of the metric at all (an empty answer would otherwise read as "no such gate")."""
    samples = list(_SAMPLE.finditer(text))
    if not samples:
        raise NoGateMetric(f"no {METRIC} sample in the {len(text)} characters answered")
    gates: dict[str, str] = {}
    for sample in samples:
        labels = dict(_LABEL.findall(sample["labels"]))
        name = labels.get("name", "")
        try:
            on = float(sample["value"]) != 0
        except ValueError:  # not a number: not a sample this parser understands
            continue
        if name.startswith(prefixes):
            gates[name] = f"{'on' if on else 'off'} ({labels.get('stage') or 'GA'})"
    return dict(sorted(gates.items()))


def unread(reason: object) -> dict[str, str]:
    """Why a component's gates are not known, on one bounded line."""
    return {UNREAD: " ".join(str(reason).split())[:_MAX_REASON]}


def read(fetch: Callable[[], str], prefixes: tuple[str, ...] = GATES_REPORTED) -> dict[str, str]:
    """enabled() of what fetch() answers; when fetching or parsing fails, unread(why). Any
    exception is a reason: whatever a component answers, the run goes on."""
    try:
        return enabled(fetch(), prefixes)
    except Exception as exc:
        return unread(f"{type(exc).__name__}: {exc}")


def record(
    out_dir: Path,
    set_by_target: dict[str, Any],
    api_server: dict[str, str],
    kubelet: dict[str, str] | None = None,
    node: str = "",
) -> Path:
    """Write FEATURE_GATES_FILE into the run dir (the suite puts it into results.json)."""
    facts: dict[str, Any] = {SET_BY_TARGET: dict(set_by_target), API_SERVER: api_server}
    if kubelet is not None:
        facts[KUBELET] = kubelet
        facts[KUBELET_NODE] = node
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(out_dir / FEATURE_GATES_FILE, json.dumps(facts, indent=2) + "\n")
