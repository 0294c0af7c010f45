"""What each target would do with a loaded profile: `hvconform profile check`'s lines.

Nothing here decides anew what a target accepts: refusals come from the targets' own rules
(hvconform.targets.honour.refusal), the container runtime's plugin container from its own
reading (container_spec), a cluster target's objects, gate and pod layout from the functions
its run calls (render_objects, prepare), all pure (they render, they create nothing). What is
described in words (how health is observed) is what those targets' modules document.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.errors import Unhonoured
from hvconform.contract.plugin import PluginUnderTest, Probe
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.strict_json import one_line
from hvconform.manifests.render import ManifestError
from hvconform.targets import TARGETS
from hvconform.targets.honour import refusal
from hvconform.targets.local.liveness import FAILURE_THRESHOLD, PERIOD_S

# (target, runtime) in the order a maintainer meets them: this machine first, clusters last.
ROWS: tuple[tuple[str, str], ...] = (
    ("local", "process"),
    ("local", "container"),
    ("node", "process"),
    ("cluster", "process"),
    ("kind", "process"),
    ("aks", "process"),
)


def _probe(probe: Probe) -> str:
    if probe.type == "http":
        return f"GET {probe.url} (placeholders filled by the target), 2xx = healthy"
    if probe.type == "grpc-health":
        return f"grpc.health.v1 Check(service={probe.service!r}) on the plugin's own socket"
    if probe.type == "exec":
        return f"`{shlex.join(probe.command)}` in the plugin's namespaces, exit 0 = healthy"
    return ""


def _health(plugin: PluginUnderTest, what: str) -> list[str]:
    """How the targets that run the plugin themselves observe it (local/node.py, realnode,
    container/node.py; liveness as the kubelet judges it: local/liveness.py)."""
    ready = _probe(plugin.readiness) or "no probe: the kubelet's allocatable (> 0) stands for it"
    live = f"the {what} runs" + (
        f", and its probe did not fail {FAILURE_THRESHOLD} times in a row {PERIOD_S:g}s apart: "
        + _probe(plugin.liveness)
        if plugin.liveness.observable
        else " (no liveness probe: an exit is its only death)"
    )
    return [f"  readiness: {ready}", f"  liveness: {live}"]


def _binds(plugin: PluginUnderTest) -> str:
    paths = plugin.paths
    view = f", host /dev -> {paths.host_dev_dir}" if paths.host_dev_dir else ""
    return (
        f"  binds: kubelet socket dir -> {paths.device_plugin_dir}, CDI dir -> {paths.cdi_dir}"
        f"{view}; devices {', '.join(paths.devices)}"
    )


def _objects(plugin: PluginUnderTest, key: str) -> str:
    deploy = plugin.deploy
    assert deploy is not None  # refusal() said so
    if deploy.chart is not None:
        values = deploy.chart.values_for(key)
        shown = ", ".join(values) if values else "the chart's defaults"
        return f"  objects (key {key!r}): helm chart {deploy.chart.path}, values: {shown}"
    files = deploy.manifests_for(key)
    return f"  objects (key {key!r}): {', '.join(files) or 'none (no such key, no *)'}"


def _process(plugin: PluginUnderTest, where: str) -> list[str]:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plugin.env.items())
    return [
        f"  runs: {shlex.join(plugin.command)} ({where}; as is, nothing appended)",
        *([f"  env: {env}"] if env else []),
        _binds(plugin),
        *_health(plugin, "process"),
    ]


def _container(plugin: PluginUnderTest) -> list[str]:
    from hvconform.targets.container.spec import TARGET_KEY, container_spec

    spec = container_spec(plugin)
    argv = [*(spec.entrypoint or ("<image ENTRYPOINT>",)), *(spec.args or ())]
    port = f"; HTTP health port {spec.health_port}" if spec.health_port else ""
    return [
        f"  image: {spec.image}",
        _objects(plugin, TARGET_KEY),
        f"  runs: {spec.workload}: {shlex.join(argv)}{port}",
        _binds(plugin),
        *_health(plugin, "container"),
    ]


def _cluster(plugin: PluginUnderTest, target: str) -> list[str]:
    from hvconform.targets.cluster.run import render_objects, values_key
    from hvconform.targets.cluster.workloads import prepare

    assert plugin.deploy is not None  # refusal() said so
    # the target's traits as the registry fills them; not its checks (no kubeconfig here)
    traits = TARGETS[target]
    options = ClusterOptions(
        target=target, image=plugin.deploy.image, default_namespace=traits.plugin_namespace
    )
    rendered, _ = render_objects(options, plugin)  # the blast-radius gate included
    _, layout = prepare(rendered.objects, pods=plugin.deploy.pods, paths=plugin.paths)
    if layout.health_port is not None:
        ready = f"GET /readyz on port {layout.health_port} through the API server's pod proxy"
    elif layout.readiness_probe:
        ready = "the pod's Ready condition (the kubelet runs its readinessProbe)"
    else:
        ready = "the pod's Ready condition; it has no readinessProbe, so Ready means running"
    probe = "a failed livenessProbe" if layout.liveness_probe else "no livenessProbe: exits only"
    lines = [
        f"  image: {rendered.image}",
        _objects(plugin, values_key(options)),
        f"  runs: DaemonSet {layout.daemonset}, container {layout.container} "
        f"({len(rendered.objects)} objects applied)",
        f"  readiness: {ready}",
        "  liveness: the container running and not restarted, and no kubelet event of a "
        f"liveness kill ({probe})",
    ]
    if "mshv" in traits.hypervisors:
        mshv = options.with_(hypervisor="mshv")
        lines.append(f"  with --hypervisor mshv: objects of key {values_key(mshv)!r}")
    return lines


_DESCRIBE: dict[str, Callable[[PluginUnderTest, str], list[str]]] = {
    "local": lambda p, _t: _process(p, "in a sandbox on this machine, kubelet emulator"),
    "node": lambda p, _t: _process(p, "in a sandbox under a real kubelet on this machine"),
}


def describe(plugin: PluginUnderTest) -> list[str]:
    """Every target's lines: what it runs and observes, or why it refuses."""
    resource = plugin.resource or "not declared: read from its Register call"
    lines = [
        f"profile {plugin.name} ({one_line(plugin.source, 200)}): API {plugin.api}, "
        f"resource {resource}, CDI kind {plugin.cdi_kind or 'read from its Allocate answers'}"
    ]
    for target, runtime in ROWS:
        lines.append(f"{target}" + (" --runtime container" if runtime == "container" else "") + ":")
        why = refusal(plugin, target, runtime)
        if why:
            lines.append(f"  refused: {one_line(why, 400)}")
            continue
        try:
            if runtime == "container":
                lines += _container(plugin)
            elif target in _DESCRIBE:
                lines += _DESCRIBE[target](plugin, target)
            else:
                lines += _cluster(plugin, target)
        except EnvironmentBlocked as exc:  # helm missing: the run's preflight would say so
            lines.append(f"  cannot render its objects here: {one_line(str(exc), 300)}")
        except (Unhonoured, ManifestError, ValueError) as exc:
            lines.append(f"  refused: {one_line(str(exc), 400)}")
    return lines
