"""The node target with a DRA driver under test (the profile's `dra` section).

The same real kubelet, API server, scheduler and containerd, and the same sandbox as a device
plugin gets; what differs is what a DRA driver needs, each given as its chart's DaemonSet would:
- the kubelet's plugin watcher dir and the driver's own plugin dir bound where the profile says
  it looks (the CDI dir and host-device view as for a device plugin);
- credentials of its own: a client certificate for the user `hv-dra-driver`, bound by RBAC to a
  DRA driver's rules only (claims: get; ResourceSlices: get, list, watch, create, update,
  delete), filled into the profile's placeholders with the node's name;
- the API server inside its network namespace, through `api_relay` (TLS end to end);
- the DeviceClass pods ask for: the profile's manifest, or one that selects every device of the
  driver and maps the profile's extended resource to it (KEP-5004).
Workload pods are scheduled (the scheduler allocates their claims). The catalogue's
observations mean here what hvconform.contract.dra says; the driver's registration socket is
the one in the kubelet's plugins_registry whose GetInfo names its driver (any name). Everything
made is deleted at the end: the DeviceClass, the RBAC objects, the driver's ResourceSlices on
this node, and of the host's directories only what the run made: the driver's plugin dir when
the run made it (written in the ledger), else only the entries that appeared in it during the
run (a dir that existed before, another driver's files in it included, stays as it was).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from hv_device_plugin.api import pluginregistration_pb2 as reg_pb
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.api.dra_wire import RESOURCE_API
from hvconform.contract.dra import (
    CAP_DRA,
    CAP_KUBELET_STOP,
    CAP_REGISTRATION_SOCKET,
    DELETION_GRACE_S,
    DEVICE_PLUGIN_ONLY,
    PREPARE_FAILED,
    SliceCounts,
    SliceView,
    each_event,
    refusal,
    scheduled_to,
    slice_view,
    unprepare_failed,
)
from hvconform.contract.dra_profile import load_device_class
from hvconform.contract.errors import ProfileError
from hvconform.contract.ledger import make_dirs, remove_made_dirs
from hvconform.contract.node import PodView
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.results import EnvironmentBlocked
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.realnode import API_PORT, KUBELET_ROOT, NODE_NAME, procs, stack
from hvconform.targets.realnode.api_relay import ApiRelay
from hvconform.targets.realnode.configs import NAMESPACE, PKI
from hvconform.targets.realnode.events import klog_monotonic
from hvconform.targets.realnode.kubeapi import ApiError
from hvconform.targets.realnode.node import RealNode
from hvconform.targets.realnode.pki import ensure_client, kubeconfig
from hvconform.targets.realnode.pods import PODS, _view
from hvconform.targets.realnode.reboot import kubelet_sock_made

RESOURCE = f"/apis/{RESOURCE_API}"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
DRIVER_USER = "hv-dra-driver"
GET_INFO_TIMEOUT_S = 2.0  # bounds one socket whose server never answers


def _rbac() -> list[tuple[str, dict[str, Any]]]:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": DRIVER_USER},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                       "verbs": ["get"]},
                      {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                       "verbs": ["get", "list", "watch", "create", "update", "delete"]}]}  # fmt: skip
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": DRIVER_USER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": DRIVER_USER},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": DRIVER_USER}]}  # fmt: skip
    return [(f"{RBAC}/clusterroles", role), (f"{RBAC}/clusterrolebindings", binding)]


def _entries(directory: Path) -> frozenset[str]:
    return frozenset(entry.name for entry in directory.iterdir())


def _remove_new(directory: Path, before: frozenset[str]) -> list[str]:
    """Remove what appeared in `directory` since `before` (the driver's sockets, made during the
    run); a name that was there before stays, whatever it is now. Never through a mount."""
    left = []
    now = _entries(directory) if directory.is_dir() else frozenset()
    for name in sorted(now - before):
        path = directory / name
        if stack.mounts_under((path,)):
            left.append(f"{path}: a mount inside")
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            left.append(f"{path}: {exc.strerror}")
    return left


class RealDraNode(SliceCounts, RealNode):
    def __init__(
        self, *, out_dir: Path, worker: str, plugin: PluginUnderTest, node_runtime: str = ""
    ) -> None:
        super().__init__(out_dir=out_dir, worker=worker, plugin=plugin, node_runtime=node_runtime)
        assert plugin.dra is not None, "a DRA node runs a DRA driver"
        self.dra = plugin.dra
        self.capabilities = (self.capabilities - DEVICE_PLUGIN_ONLY) | {
            CAP_DRA, CAP_KUBELET_STOP, CAP_REGISTRATION_SOCKET}  # fmt: skip
        self._relay: ApiRelay | None = None
        self._made: list[str] = []  # API paths of the objects made here, deleted at the end
        self._registry = KUBELET_ROOT / "plugins_registry"
        self._endpoint_dir = Path(self.dra.endpoint_dir)
        self._stopped_wall = 0.0  # when stop_kubelet stopped it (its new socket is newer)
        self._socket_removed = False  # the restore checks the driver registered again
        # What the plugin dir held before the run when it existed already (the run removes
        # only what appeared since); None when the run made it (the ledger says so) or not yet.
        self._endpoint_before: frozenset[str] | None = None

    # -- around the plugin ----------------------------------------------------------------

    def _before_plugin(self) -> None:
        plugins = KUBELET_ROOT / "plugins"
        if self._endpoint_dir == plugins or not self._endpoint_dir.is_relative_to(plugins):
            raise EnvironmentBlocked(
                f"dra.pluginDir {self._endpoint_dir}: the kubelet here dials driver endpoints "
                f"in a driver's own dir below {plugins} (its own path, as a hostPath gives it)"
            )
        klass = self._device_class()  # first: a manifest changed since the load blocks the run
        ensure_client(PKI, DRIVER_USER, f"/O={DRIVER_USER}/CN={DRIVER_USER}")
        for path, body in _rbac():
            self._make(path, body)
        self._make(f"/apis/{klass['apiVersion']}/deviceclasses", klass)
        self._prepare_dirs()

    def _prepare_dirs(self) -> None:
        """The registry and plugin dirs: made (each one written in the ledger) where missing;
        an existing plugin dir is used as it is, what it holds noted first."""
        make_dirs(self.ledger, self._registry, "the kubelet's plugin watcher dir")
        if os.path.lexists(self._endpoint_dir):
            if self._endpoint_dir.is_symlink() or not self._endpoint_dir.is_dir():
                raise EnvironmentBlocked(
                    f"dra.pluginDir {self._endpoint_dir}: exists and is not a directory"
                )
            self._endpoint_before = _entries(self._endpoint_dir)
        else:
            make_dirs(self.ledger, self._endpoint_dir, "the DRA driver's plugin dir")

    def _after_plugin(self) -> None:
        try:
            self._delete_slices()
            for path in reversed(self._made):
                with contextlib.suppress(ApiError):
                    self._api().request("DELETE", path)
            self._made.clear()
        finally:
            left = self._release_dirs()
        assert not left, "; ".join(left)

    def _release_dirs(self) -> list[str]:
        """Only what the run made: its plugin dir (ledger), or what appeared in one that existed
        before the run; the registry dir when the run made it (the kubelet's, normally)."""
        if self._endpoint_before is not None:
            left = _remove_new(self._endpoint_dir, self._endpoint_before)
        else:
            left = remove_made_dirs(self.ledger, self._endpoint_dir, tree=True)
        # the kubelet's registry once empty; while it holds a socket the ledger's check names it
        remove_made_dirs(self.ledger, self._registry, tree=False)
        return left

    def _make(self, collection: str, body: dict[str, Any]) -> None:
        path = f"{collection}/{body['metadata']['name']}"
        with contextlib.suppress(ApiError):  # a leftover of a killed run: made again here
            self._api().request("DELETE", path)
        self._api().request("POST", collection, body)
        self._made.append(path)

    def _device_class(self) -> dict[str, Any]:
        if self.dra.device_class:
            try:  # read again as at the load: the same rules, whatever the file is now
                return load_device_class(
                    self.dra.device_class, "dra.deviceClass", self.dra.extended_resource
                )
            except ProfileError as exc:
                raise EnvironmentBlocked(str(exc)) from None
        return {"apiVersion": RESOURCE_API, "kind": "DeviceClass",
                "metadata": {"name": self.dra.driver},
                "spec": {"selectors": [{"cel": {
                    "expression": f'device.driver == "{self.dra.driver}"'}}],
                         "extendedResourceName": self.dra.extended_resource}}  # fmt: skip

    def _binds(self, sockets: Path) -> list[tuple[str, str]]:
        paths = self.plugin.paths
        binds = [(str(self._registry), self.dra.registration_dir),
                 (str(self._endpoint_dir), self.dra.endpoint_dir),
                 (str(self.dirs["cdi"]), paths.cdi_dir)]  # fmt: skip
        if paths.host_dev_dir:
            binds.append((str(self.dirs["host_dev"]), paths.host_dev_dir))
        return binds

    def _facts(self) -> dict[str, str]:
        config = self.state / "dra-driver.kubeconfig"
        if not config.exists():
            kubeconfig(PKI, DRIVER_USER, config)
        return {
            "node_name": NODE_NAME,
            "kube_api_server": f"https://127.0.0.1:{API_PORT}",
            "kube_ca_file": str(PKI / "ca.crt"),
            "kube_client_cert": str(PKI / f"{DRIVER_USER}.crt"),
            "kube_client_key": str(PKI / f"{DRIVER_USER}.key"),
            "kubeconfig": str(config),
        }

    def _before_start(self, sandbox: PluginSandbox) -> None:
        sandbox.make_netns()
        assert sandbox.netns is not None
        self._relay = ApiRelay(sandbox.netns.path, API_PORT)

    def _stop_plugin(self) -> None:
        # first: its listening socket would keep the sandbox's namespace alive
        if self._relay is not None:
            left = self._relay.close()
            self._relay = None
            assert not left, "; ".join(left)
        super()._stop_plugin()

    # -- observations -----------------------------------------------------------------------

    def slices(self) -> list[SliceView]:
        items = self._api().get(f"{RESOURCE}/resourceslices")["items"]
        views = (slice_view(item, self.dra.driver, NODE_NAME) for item in items)
        return [v for v in views if v is not None]

    def _delete_slices(self) -> None:
        for item in self._api().get(f"{RESOURCE}/resourceslices")["items"]:
            if slice_view(item, self.dra.driver, NODE_NAME) is not None:
                with contextlib.suppress(ApiError):
                    self._api().request(
                        "DELETE", f"{RESOURCE}/resourceslices/{item['metadata']['name']}"
                    )

    def last_registration_at(self) -> float | None:
        """When the kubelet's plugin watcher last started registering a driver socket."""
        last = None
        for line in procs.log_tail("kubelet", 5000).splitlines():
            if "OperationExecutor.RegisterPlugin started" in line and str(self._registry) in line:
                last = klog_monotonic(line) or last
        return last

    # -- pods ---------------------------------------------------------------------------------

    def _placed(self, pod: dict[str, Any]) -> dict[str, Any]:
        return scheduled_to(pod, NODE_NAME)

    def _allocation_settled(self, name: str) -> tuple[dict[str, Any], str, str] | None:
        settled = super()._allocation_settled(name)
        if settled is not None:
            return settled
        pod = self._pod(name)
        if pod is None:
            return None
        why = refusal(pod, lambda: self._prepare_events(name))
        return None if why is None else (pod, *why)

    def _prepare_events(self, name: str) -> list[str]:
        path = (f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector="
                f"involvedObject.name%3D{name},reason%3D{PREPARE_FAILED}")  # fmt: skip
        return each_event(self._api().get(path)["items"])

    def prepare_failures(self, name: str) -> int:
        return len(self._prepare_events(name))

    def request_pod_deletion(self, name: str) -> None:
        self._api().request("DELETE", f"{PODS}/{name}?gracePeriodSeconds={DELETION_GRACE_S}")

    def unprepare_failures(self, name: str) -> int:
        lines = procs.log_tail("kubelet", 5000).splitlines()
        return sum(1 for line in lines if unprepare_failed(line, name))

    def submit_pod(self) -> str:
        name = f"hv-pod-{uuid.uuid4().hex[:8]}"
        self._api().request("POST", PODS, self._workload_spec(name, ""))
        return name

    def pod_named(self, name: str) -> PodView | None:
        pod = self._pod(name)
        if pod is not None:
            self._pod_uids[name] = pod["metadata"]["uid"]
        return None if pod is None else _view(pod)

    def pod_scheduled(self, name: str) -> bool:
        pod = self._pod(name)
        return bool(pod and pod.get("spec", {}).get("nodeName"))

    # -- the kubelet ----------------------------------------------------------------------------

    def stop_kubelet(self, graceful: bool) -> None:
        kubelet = procs.recorded("kubelet")
        assert kubelet is not None
        self._stopped_wall = time.time()
        self.touched()
        kubelet.stop(sig=signal.SIGTERM if graceful else signal.SIGKILL)

    def start_kubelet(self) -> float:
        stack.start_kubelet(self.api)
        return kubelet_sock_made(self._stopped_wall)

    # -- the registration socket ------------------------------------------------------------

    def _registration_socket(self) -> Path | None:
        """The socket in the kubelet's registry dir whose GetInfo names the driver, as the
        kubelet's plugin watcher asks it (whatever the socket is called)."""
        for path in sorted(self._registry.iterdir()):
            if not path.is_socket():
                continue
            try:
                with grpc.insecure_channel(f"unix://{path}") as channel:
                    info = reg_grpc.RegistrationStub(channel).GetInfo(
                        reg_pb.InfoRequest(), timeout=GET_INFO_TIMEOUT_S
                    )
            except grpc.RpcError:
                continue  # a stale socket nothing serves, or not a registration server
            if info.name == self.dra.driver:
                return path
        return None

    def remove_registration_socket(self) -> float:
        path = self._registration_socket()
        assert path is not None, (
            f"no socket in {self._registry} answers GetInfo with driver {self.dra.driver}"
        )
        self._socket_removed = True
        self.touched()
        removed = time.monotonic()  # before: a fast driver may be registered again during it
        path.unlink()
        return removed

    def restore_baseline(self) -> list[str]:
        """A driver that never served its registration socket again is not registered: it is
        restarted (as its DaemonSet's pod would be) before the node's baseline is checked."""
        if self._socket_removed:
            self._socket_removed = False
            if self.plugin_running() and self._registration_socket() is None:
                self.restart_plugin()
        return super().restore_baseline()
