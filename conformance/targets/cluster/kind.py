"""The kind target: a throwaway kind cluster whose node sees the host's /dev/kvm.

Lifecycle through the `kind` executable (create with kind/cluster.yaml, `kind load docker-image`
with a fixed tag, delete unless --keep-cluster), node access by `docker exec` into the node
container, kubelet restart by systemctl inside it. The bind-mounted /dev/kvm is the host's inode,
so the host's metadata is checked in two phases around the cluster (metadata_twophase):
startup may change only the GID, to the node's own kvm group; the final check must match exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hvconform.contract import featuregates
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.runcontext import RunContext
from hvconform.contract.safeyaml import UnsafeInput, load_strict, read_bounded
from hvconform.targets.cluster.access import (
    CommandFailed,
    CommandRunner,
    DockerExecAccess,
    NodeAccess,
)
from hvconform.targets.cluster.existing import (
    MetadataCheck,
    cluster_steps,
    default_metadata,
    failed_verdict,
    verdict_message,
)
from hvconform.targets.cluster.kindbin import kind_env, kind_facts
from hvconform.targets.cluster.kube import Obj
from hvconform.targets.cluster.lifecycle import Action
from hvconform.targets.cluster.node import ClusterNode
from hvconform.targets.cluster.plan import ClusterOptions, Step
from hvconform.targets.cluster.run import (
    ClusterLifecycle,
    cluster_options,
    open_cluster,
    plan_of,
    quote,
)

CLUSTER_LABEL = "io.x-k8s.kind.cluster"  # kind labels each node container with its cluster
# `nox -s kind-image`'s image, hvconform.targets.kindnode.NODE_IMAGE (a test ties the two: the
# cluster family may not import kindnode, which builds on the real node target).
OFFLINE_NODE_IMAGE = "hv-kind.local/node:v1.37.2"
# What `kind create cluster` prints when its node image is neither on this machine nor pullable:
# kind's own "failed to pull image", and the engine's reasons (no registry reachable, no such
# repository or tag). Any of them: the machine lacks the image, no check can say anything.
_PULL_FAILURES = (
    "no such host",
    "pull access denied",
    "manifest unknown",
    "repository does not exist",
    "unable to find image",
    "failed to pull image",
)
CONFIG_LIMIT = 1 << 20  # a kind config is a page or two; --kind-config is the caller's file


def node_image_unpullable(stderr: str, node_image: str) -> str | None:
    """The one-line environment_blocked reason when `kind create` failed because the node image
    could not be pulled; None for any other failure (those are the run's own errors)."""
    lines = [" ".join(ln.split()) for ln in stderr.splitlines() if ln.strip()]
    for needle in _PULL_FAILURES:  # the most specific reason first, kind's wrapper last
        seen = next((ln for ln in lines if needle in ln.lower()), None)
        if seen is not None:
            detail = seen.removeprefix("ERROR: ").removeprefix("Command Output: ")[:240]
            return (
                f"kind create cluster: node image {node_image} is not on this machine and "
                f"cannot be pulled ({detail}); fix: build one offline: nox -s kind-image, "
                f"then --node-image {OFFLINE_NODE_IMAGE}"
            )
    return None


def config_gates(path: str) -> dict[str, Any]:
    """The feature gates a kind config sets: its top-level featureGates, which kind passes to
    every component (kind/cluster.yaml sets none, so the node image's Kubernetes defaults hold).
    A gate set for one component only (a kubeadm patch) shows in that component's own word."""
    try:
        data = load_strict(read_bounded(path, CONFIG_LIMIT), path)
    except UnsafeInput as exc:  # kind read it at create; gone since: said, the run goes on
        return featuregates.unread(exc)
    gates = data.get("featureGates") if isinstance(data, dict) else None
    return {str(k): v for k, v in gates.items()} if isinstance(gates, dict) else {}


def kubelet_errors(journal: str, keep: int = 4) -> str:
    """The kubelet's last error lines ("E1203 ..." in klog, or a journal line naming an error):
    why a node never became ready is nearly always there."""
    lines = [ln for ln in journal.splitlines() if " E" in ln[:40] or "error" in ln.lower()]
    return "\n".join(f"kubelet: {ln.strip()[:300]}" for ln in lines[-keep:])


class KindLifecycle(ClusterLifecycle):
    name = "kind"

    def __init__(
        self,
        options: ClusterOptions,
        objects: list[Obj] | None = None,
        *,
        metadata: MetadataCheck | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(options, objects, **kw)
        self.node_name = f"{options.cluster_name}-control-plane"
        self.metadata = metadata
        self._docker = DockerExecAccess(self.runner, self.node_name)

    def access(self) -> NodeAccess:
        return self._docker

    def gates_set(self) -> dict[str, Any]:
        # --existing-cluster: made before this run, perhaps with another config
        return {} if self.options.existing_cluster else config_gates(self.options.kind_config)

    def node_cmd(self, argv: list[str]) -> str:
        return self._docker.wrap(argv)

    def steps(self) -> list[Step]:
        o = self.options
        name, kcfg = o.cluster_name, self.kubeconfig
        shared = self.shared_steps()
        kept = o.keep_cluster or o.existing_cluster
        images = [o.image] + ([o.guest_image] if o.guest_image and o.guest_image != o.image else [])
        # --retain: a node that failed to start stays for `kind export logs` (kind-delete is armed)
        create = (
            "kind", "create", "cluster", "--name", name, "--config", o.kind_config,
            "--image", o.node_image, "--kubeconfig", kcfg, "--wait", "120s", "--retain",
        )  # fmt: skip
        delete = ("kind", "delete", "cluster", "--name", name, "--kubeconfig", kcfg)
        steps = [
            Step("metadata-snapshot", "setup", f"host: snapshot {o.device} metadata (phase 0)"),
            Step(
                "kind-existing",
                "setup",
                f"use the existing kind cluster {name} (--existing-cluster; never deleted)",
                argv=("kind", "export", "kubeconfig", "--name", name, "--kubeconfig", kcfg),
                arms="kind-keep",
            )
            if o.existing_cluster
            else Step(
                "kind-create",
                "setup",
                f"create kind cluster {name} (kubeconfig kept apart from ~/.kube)",
                argv=create,
                arms="kind-keep" if o.keep_cluster else "kind-delete",
            ),
            Step(
                "metadata-startup",
                "setup",
                f"host {o.device}: unchanged, or only its GID changed to the node's kvm group",
                argv=("docker", "exec", self.node_name, "getent", "group", "kvm"),
            ),
            *[
                Step(
                    f"kind-load{'-guest' if i else ''}",
                    "setup",
                    f"load {image} into the node (fixed tag, never :latest)",
                    argv=("kind", "load", "docker-image", image, "--name", name),
                )
                for i, image in enumerate(images)
            ],
            # the existing-cluster target's steps: kind only makes and deletes the cluster
            *cluster_steps(shared, None, verify_objects=kept),
        ]
        if kept:
            steps += [
                Step(
                    "kind-keep",
                    "cleanup",
                    f"keep cluster {name} (--keep-cluster): {quote(list(delete))}",
                ),
            ]
        else:
            steps += [
                Step("kind-delete", "cleanup", f"delete kind cluster {name}", argv=delete),
                Step(
                    "verify-cluster-gone",
                    "verify",
                    f"kind no longer lists {name}",
                    argv=("kind", "get", "clusters"),
                ),
                Step(
                    "verify-nodes-gone",
                    "verify",
                    f"no container of {name} left (its node and volume), no kubeconfig entry",
                    argv=(
                        "docker",
                        "ps",
                        "--all",
                        "--quiet",
                        "--filter",
                        f"label={CLUSTER_LABEL}={name}",
                    ),
                ),
            ]
        steps.append(
            Step("metadata-final", "verify", f"host {o.device} metadata exactly as validated")
        )
        return steps

    def actions(self) -> dict[str, Action]:
        return {
            **super().actions(),
            "metadata-snapshot": lambda s: self._metadata("snapshot"),
            "kind-create": self._create,
            "metadata-startup": self._startup,
            "kind-keep": lambda s: self.report.notes.append(f"cluster kept: {s.what}"),
            "verify-cluster-gone": self._verify_gone,
            "verify-nodes-gone": self._verify_nodes_gone,
            "metadata-final": lambda s: self._metadata("final"),
        }

    def _metadata(self, phase: str) -> None:
        if self.metadata is None:
            self.metadata = default_metadata(self.options.device)
        if self.metadata is None:
            self.report.verify(f"metadata {phase}", False, "hvconform.metadata.twophase missing")
            return
        if phase == "snapshot":
            self.metadata.snapshot_original()  # raises when the host device cannot be lstat'ed
            return
        verdict = self.metadata.check_final()
        self.report.environment["metadata_two_phase"] = self.metadata.summary()
        self.report.verify(
            "host device metadata (final)", not failed_verdict(verdict), verdict_message(verdict)
        )

    def _create(self, step: Step) -> None:
        """kind create; when it fails, the node's logs (kubelet, containerd, journal) are exported
        before the armed kind-delete removes the node, and the error says where they are. A node
        image that cannot be pulled is the machine's lack, not a failure: EnvironmentBlocked."""
        try:
            self.runner.run(list(step.argv))
        except CommandFailed as exc:
            blocked = node_image_unpullable(exc.stderr, self.options.node_image)
            if blocked is not None:  # no node was made: nothing to export, no check can run
                raise EnvironmentBlocked(blocked) from None
            logs = Path(self.options.workdir) / f"kind-logs-{self.options.cluster_name}"
            export = ["kind", "export", "logs", str(logs), "--name", self.options.cluster_name]
            got = self.runner.run(export, timeout=180, check=False)
            kubelet = logs / self.node_name / "kubelet.log"
            tail = kubelet_errors(kubelet.read_text(errors="replace")) if kubelet.exists() else ""
            where = f"node logs in {logs}" if got.rc == 0 else "node logs could not be exported"
            raise CommandFailed(exc.argv, exc.rc, f"{exc.stderr}\n{where}\n{tail}") from None

    def _startup(self, step: Step) -> None:
        if self.metadata is None:
            self.report.notes.append("startup metadata check skipped: no two-phase helper")
            return
        # getent's text as is: an empty or failed lookup is an error verdict, never a gid.
        lookup = self.runner.run(list(step.argv), check=False).stdout.decode()
        verdict = self.metadata.check_startup(lookup)
        self.report.verify(
            "host device metadata (startup)", not failed_verdict(verdict), verdict_message(verdict)
        )
        if failed_verdict(verdict):
            raise RuntimeError(
                f"host {self.options.device} metadata at startup: {verdict_message(verdict)}"
            )

    def _verify_gone(self, step: Step) -> None:
        listed = self.runner.run(list(step.argv), check=False).stdout.decode().split()
        gone = self.options.cluster_name not in listed
        self.report.verify("kind cluster deleted", gone, f"kind get clusters: {listed}")

    def _verify_nodes_gone(self, step: Step) -> None:
        # `docker rm --volumes` by kind removes each node's anonymous /var volume with it.
        left = self.runner.run(list(step.argv), check=False)
        ids = left.stdout.decode().split()
        self.report.verify(
            "kind node containers removed",
            left.rc == 0 and not ids,
            f"containers labelled {CLUSTER_LABEL}={self.options.cluster_name}: {ids or 'none'}"
            + ("" if left.rc == 0 else f" (docker ps failed: {left.stderr.decode()[-200:]})"),
        )
        kubeconfig = Path(self.kubeconfig)
        text = kubeconfig.read_text() if kubeconfig.exists() else ""
        context = f"kind-{self.options.cluster_name}"
        self.report.verify(
            "kubeconfig entries removed",
            context not in text,
            f"{kubeconfig}: {'still names' if context in text else 'no'} {context}",
        )


def announce(options: ClusterOptions) -> str:
    """Printed before the run: which kind binary and node image make the cluster."""
    facts = kind_facts(options.node_image)
    return f"kind {facts['kind']} ({facts['kind_version']}), node image {facts['node_image']}"


def build_plan(
    options: ClusterOptions,
    objects: list[Obj] | None = None,
    plugin: PluginUnderTest | None = None,
) -> list[Step]:
    """The kind plan; builds the lifecycle without running anything."""
    return KindLifecycle(options, objects, plugin=plugin).steps()


def plan_text(options: ClusterOptions, plugin: PluginUnderTest | None = None) -> str:
    """What `--dry-run` prints for kind."""
    title = f"hvconform plan: kind cluster {options.cluster_name}, image {options.image}"
    return plan_of(KindLifecycle(options, None, plugin=plugin), title)


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[ClusterNode]:
    """The registry's entry: a kind cluster made for this run, its node, always deleted."""
    options = cluster_options(ctx, "kind")
    out_dir = ctx.out
    extra = {"metadata": metadata} if metadata is not None else {}
    # kind from PATH, else the one `nox -s kind-image` built into its cache (kindbin)
    runner = CommandRunner(Path(options.workdir) / "commands.log", env=kind_env())
    lifecycle = KindLifecycle(options, None, runner=runner, plugin=ctx.plugin, **extra)  # type: ignore[arg-type]
    lifecycle.report.environment.update(kind_facts(options.node_image))
    with open_cluster(lifecycle, out_dir=out_dir) as node:
        yield node
