"""Environment rows of schema 1.1: cgroups, the suite, every component's version (asked from
the program itself), the cluster's server and nodes, and the preconditions checked.

`model.environment_rows` adds these after its own rows; KEYS are the environment keys read here,
so they are not repeated as raw values. Every value is plain text: the templates escape it.
"""

from __future__ import annotations

from typing import Any

from hvconform.contract import featuregates as fg

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


def _runtimes(found: Any) -> list[tuple[str, str]]:
    """Each node's container runtime as its daemon said it: which, and its CDI (off means the
    runtime drops what a plugin's allocation names: the runtime's failure, not the plugin's)."""
    if not isinstance(found, list):
        return []
    out = []
    for r in found:
        if not isinstance(r, dict):
            continue
        where = f"Container runtime ({r.get('node') or r.get('worker', '?')})"
        if r.get("error"):
            out.append((where, f"not read: {r['error']}"))
            continue
        cdi = {True: "CDI on", False: "CDI OFF", None: "CDI not reported"}.get(
            r.get("cdi_enabled"), "CDI not reported"
        )
        dirs = ", ".join(str(d) for d in r.get("cdi_spec_dirs") or [])
        out.append(
            (where, f"{r.get('name', '?')} {r.get('version', '?')}, {cdi}"
             + (f" (spec dirs {dirs})" if dirs else ""))
        )  # fmt: skip
    return out


def _said(said: dict[Any, Any]) -> str:
    """A component's gates as read, or why they could not be."""
    if set(said) == {fg.UNREAD}:
        return f"not read: {said[fg.UNREAD]}"
    return ", ".join(f"{k} {v}" for k, v in said.items())


def _gates(gates: Any) -> list[tuple[str, str]]:
    """The feature gates the target set, and what its API server and the kubelet of the node
    under test said of the ones that matter."""
    if not isinstance(gates, dict):
        return []
    set_by = gates.get(fg.SET_BY_TARGET) or {}
    if not isinstance(set_by, dict) or not set_by:
        text = "none: the Kubernetes version's defaults"
    elif set(set_by) == {fg.UNREAD}:
        text = _said(set_by)
    else:
        text = ", ".join(f"{k}={v}" for k, v in set_by.items())
    out = [("Feature gates set", text)]
    said = gates.get(fg.API_SERVER)
    if isinstance(said, dict) and said:
        out.append(("Feature gates (API server)", _said(said)))
    said = gates.get(fg.KUBELET)
    if isinstance(said, dict) and said:
        node = gates.get(fg.KUBELET_NODE)
        out.append((f"Feature gates (kubelet{f' of {node}' if node else ''})", _said(said)))
    return out


def rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    """Label and value for the 1.1 facts present in env (none for a 1.0 results file)."""
    out = _cgroup(env.get("cgroup"))
    if env.get("suite_version"):
        out.append(("Suite", f"hvconform {env['suite_version']}"))
    return (
        out
        + _components(env.get("components"))
        + _runtimes(env.get("container_runtime"))
        + _cluster(env.get("cluster"))
        + _gates(env.get("feature_gates"))
        + (_preconditions(env.get("preconditions")))
    )
