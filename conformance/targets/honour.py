"""What each target can honour of a plugin under test, asked before anything runs.

A target never substitutes another plugin: when it cannot run what the profile describes, the
run is refused (exit 2) with one line naming the profile's field and the target. The rules are
per target family and written once, here, from what each family does with a profile:
- the local target's process runtime and the node target run the profile's `command` as a
  process, with the node's directories bound where the profile's `paths` say;
- the local target's container runtime runs `deploy.image` as its objects' plugin container
  says (command, args, env, mounts);
- kind, AKS and an existing cluster apply `deploy`'s objects;
- a DRA driver (the profile's `dra` section) runs where a target has a DRA node: node, kind and
  an existing cluster (whose pods reach the API server in-cluster, as the driver's DaemonSet
  does).
"""

from __future__ import annotations

from hvconform.contract.plugin import PluginUnderTest
from hvconform.targets import TARGETS


def _where(target: str, runtime: str) -> str:
    return f"--target {target}" + (f" --runtime {runtime}" if runtime != "process" else "")


def refusal(plugin: PluginUnderTest, target: str, runtime: str, *, image: str = "") -> str:
    """Why `target` cannot run `plugin` as described (one line), or "" when it can."""
    where = _where(target, runtime)
    who = f"plugin {plugin.name!r} ({plugin.source})"
    # a cluster target applies the profile's objects; a DRA node is a target's trait (Target.dra)
    cluster = TARGETS[target].cluster
    from_image = cluster or runtime == "container"
    if plugin.dra is not None and (not TARGETS[target].dra or runtime != "process"):
        # The local target's kubelet is an emulator of the device plugin API; AKS's recorded
        # contract has no DRA side (no AKS API here to measure one against).
        with_dra = " or ".join(f"--target {n}" for n, t in TARGETS.items() if t.dra)
        return (
            f"dra: {who} is a DRA driver; {where} judges device plugins only: judge it with "
            f"{with_dra} (a real kubelet, API server and scheduler)"
        )
    if from_image and plugin.deploy is None:
        return (
            f"deploy: {who} has no deploy section (image, chart or manifests, pods); {where} "
            "runs a plugin from its image and objects (README: Testing your own plugin)"
        )
    if cluster and not plugin.resource:
        return (
            f"resource: {who} does not declare the extended resource it advertises; {where} "
            "requests it in workload pods and cannot watch the plugin's Register call"
        )
    if image and not from_image:
        return f"--image: {where} runs the profile's command as a process, not an image"
    if runtime == "container" and plugin.deploy is not None:
        problem = _container_problem(plugin)
        if problem:
            return problem
    if target == "kind" and "/dev/mshv" in plugin.paths.devices:
        return f"paths.devices: {where} gives its node the host's /dev/kvm only, not /dev/mshv"
    if target == "aks" and len(plugin.paths.devices) > 1:
        return f"paths.devices: {where} tests one hypervisor per run; list /dev/kvm or /dev/mshv"
    return ""


def _container_problem(plugin: PluginUnderTest) -> str:
    """What of the profile's plugin container the container runtime cannot honour ('' when
    all of it can). helm missing is the preflight's to report (environment_blocked)."""
    from hvconform.contract.errors import Unhonoured
    from hvconform.contract.results import EnvironmentBlocked
    from hvconform.manifests.render import ManifestError
    from hvconform.targets.container.spec import container_spec

    try:
        container_spec(plugin)
    except Unhonoured as exc:
        return str(exc).splitlines()[0]
    except ManifestError as exc:
        return f"deploy: {str(exc).splitlines()[0]}"
    except EnvironmentBlocked:
        return ""
    return ""
