"""The commented profile `hvconform profile init` writes from a DaemonSet's facts.

Values are written as JSON (a subset of YAML the strict loader reads back exactly), so no
escaping question is left to a hand-made YAML emitter; comments are one line each, what a
maintainer needs to decide, and say for every value whether it was read or GUESSED.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from hvconform.contract.deploy import VALUES_KEYS
from hvconform.contract.strict_json import one_line
from hvconform.profile_tool.daemonset import Fact, Facts


@dataclass(frozen=True)
class Source:
    """Where the objects came from, as the profile's deploy section names it."""

    kind: Literal["manifest", "chart"]
    path: str  # relative to the profile's directory, or absolute (a profile on stdout)
    shown: str  # as the user gave it, for the header


def _v(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True)


def _why(fact: Fact) -> str:
    return one_line(("read: " if fact.read else "GUESSED: ") + fact.note, 160)


def _line(key: str, fact: Fact, indent: str = "") -> str:
    return f"{indent}{key}: {_v(fact.value)}  # {_why(fact)}"


def render(facts: Facts, source: Source, *, resource: str = "") -> str:
    """The profile's text; the caller loads it back (load_profile's rules) before writing."""
    shown = one_line(source.shown, 160)
    container = one_line(str(facts.container.value), 80)
    out = [
        "# Plugin profile for hvconform, started by `hvconform profile init` from",
        f"# {shown} (DaemonSet {one_line(facts.daemonset, 80)}, container {container}).",
        "# Each value says where it came from: `read` (the plugin's own objects say it) or",
        "# `GUESSED` (a default, or a reading to confirm before a run). `hvconform profile check",
        '# FILE` prints what each target runs; README "Testing your own plugin" explains each key.',
        _line("name", facts.name),
        "# command: what the local target (process runtime) and the node target run on this",
        "# machine, as is (nothing appended). {profile_dir} is this file's directory; {health_addr}",
        "# is the address the target gives the plugin for HTTP health.",
        _line("command", facts.command),
        _line("env", facts.env),
        "# paths: where the plugin looks, inside its container (the mountPath of each hostPath);",
        "# every target binds the node's kubelet socket dir, CDI dir and devices there.",
        "paths:",
        _line("devicePluginDir", facts.device_plugin_dir, "  "),
        _line("cdiDir", facts.cdi_dir, "  "),
        _line("devices", facts.devices, "  "),
    ]
    if facts.host_dev_dir is not None:
        out.append(_line("hostDevDir", facts.host_dev_dir, "  "))
    out += [
        "# readiness, liveness: how the suite observes the plugin where it runs it (local, node,",
        "# --runtime container); type http (url), grpc-health (service, on the plugin's socket),",
        "# exec (command) or none. Cluster targets read the pod and the kubelet's events instead.",
        _line("readiness", facts.readiness),
        _line("liveness", facts.liveness),
        "# resource: the extended resource workloads request. kind, aks and cluster need it; the",
        "# local and node targets read it from the plugin's Register call when it is absent.",
    ]
    if resource:
        out.append(f"resource: {_v(resource)}  # read: --resource")
    else:
        out.append('# resource: "example.com/kvm"  # GUESSED: uncomment with the plugin\'s own')
    out += [
        "# deploy: how it runs where plugins really run (--runtime container, kind, aks, cluster):",
        "# the image, the objects (applied as given apart from the overrides README documents:",
        "# namespace, image, node selection) and how the suite finds the plugin's pods.",
        "deploy:",
        _line("image", facts.image, "  "),
    ]
    if source.kind == "manifest":
        out += [
            f'  # manifests per target key ({", ".join(VALUES_KEYS[1:])}), "*" for the rest',
            "  manifests:",
            f'    "*": [{_v(source.path)}]  # read: the file this profile was made from',
        ]
    else:
        out += [
            "  chart:",
            f"    path: {_v(source.path)}  # read: the chart this profile was made from",
            f"    # values: values files per target key ({', '.join(VALUES_KEYS)}),",
            "    # relative to the chart, e.g. {kind: [targets/kind.yaml]}; set: values on top.",
        ]
    out += [
        "  pods:",
        _line("labels", facts.labels, "    "),
        _line("container", facts.container, "    "),
    ]
    out += [f"# not used: {one_line(s, 120)}" for s in facts.skipped]
    return "\n".join(out) + "\n"
