"""Environment rows of schema 1.1: cgroups, the suite, every component's version (asked from
the program itself), the cluster's server and nodes, and the preconditions checked.

`model.environment_rows` adds these after its own rows; KEYS are the environment keys read here,
so they are not repeated as raw values. Every value is plain text: the templates escape it.
"""

from __future__ import annotations

from typing import Any

KEYS = frozenset(
    {"cgroup", "suite_version", "components", "cluster", "preconditions", "feature_gates"}
)


def _cgroup(info: Any) -> list[tuple[str, str]]:
    if not isinstance(info, dict):
        return []
    text = f"{info.get('version', 'unknown')}, driver {info.get('driver', 'unknown')}"
    if info.get("controllers"):
        text += f" (controllers {info['controllers']})"
    return [("Cgroups", text)]


def _components(components: Any) -> list[tuple[str, str]]:
    if not isinstance(components, dict):
        return []
    rows = []
    for name, info in components.items():
        if not isinstance(info, dict):
            continue
        text = str(info.get("version", "unknown"))
        if info.get("command"):
            text += f" (asked: {info['command']})"
        rows.append((str(name), text))
    return rows


def _cluster(cluster: Any) -> list[tuple[str, str]]:
    if not isinstance(cluster, dict):
        return []
    rows = []
    if cluster.get("server_version"):
        rows.append(("Cluster API server", str(cluster["server_version"])))
    for node in cluster.get("nodes") or []:
        if not isinstance(node, dict):
            continue
        rows.append(
            (
                f"Cluster node {node.get('name', '?')}",
                f"kubelet {node.get('kubelet', '?')}, runtime {node.get('container_runtime', '?')}"
                f", OS image {node.get('os_image', '?')}, kernel {node.get('kernel', '?')}",
            )
        )
    return rows


def _preconditions(found: Any) -> list[tuple[str, str]]:
    if not isinstance(found, list) or not found:
        return []
    unmet = [f for f in found if isinstance(f, dict) and not f.get("ok")]
    if not unmet:
        names = ", ".join(str(f.get("component", "?")) for f in found if isinstance(f, dict))
        return [("Preconditions", f"all {len(found)} met: {names}")]
    return [
        (
            "Precondition not met",
            f"{f.get('component', '?')}: found {f.get('found', '?')}, needs {f.get('need', '?')}"
            + (f"; fix: {f['fix']}" if f.get("fix") else ""),
        )
        for f in unmet
    ]


def _gates(gates: Any) -> list[tuple[str, str]]:
    """The feature gates the target set, and what its API server said of the ones that matter."""
    if not isinstance(gates, dict):
        return []
    set_by = gates.get("set_by_target") or {}
    said = gates.get("api_server") or {}
    out = [("Feature gates set", ", ".join(f"{k}={v}" for k, v in set_by.items()) if set_by
             else "none: the Kubernetes version's defaults")]  # fmt: skip
    if isinstance(said, dict) and said:
        out.append(("Feature gates (API server)", ", ".join(f"{k} {v}" for k, v in said.items())))
    return out


def rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    """Label and value for the 1.1 facts present in env (none for a 1.0 results file)."""
    out = _cgroup(env.get("cgroup"))
    if env.get("suite_version"):
        out.append(("Suite", f"hvconform {env['suite_version']}"))
    return (
        out
        + _components(env.get("components"))
        + _cluster(env.get("cluster"))
        + _gates(env.get("feature_gates"))
        + (_preconditions(env.get("preconditions")))
    )
