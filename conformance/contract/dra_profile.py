"""The `dra` section of a plugin profile: the plugin under test is a DRA driver, not a device
plugin.

A DRA driver speaks other APIs than a device plugin (the kubelet's plugin registration and
`k8s.io/kubelet/pkg/apis/dra/v1`, the API server's `resource.k8s.io/v1`), so the suite needs
other facts about it, each declared once here:

- `driver`: its driver name (a DNS subdomain: its ResourceSlices and DeviceClass selectors
  carry it);
- `extendedResource`: the extended resource a DeviceClass maps to it (KEP-5004,
  `extendedResourceName`): the suite's workload pods ask for it with a pod spec unchanged from
  the device-plugin world;
- `deviceClass`: optional, a manifest file holding the driver's own DeviceClass (it must select
  the driver's devices and name `extendedResource`); without it the suite makes one that selects
  every device of the driver. It is read at load as every file of a user's is: a regular file
  named itself (no symlink, no FIFO, no device), bounded, strict YAML, one mapping that is a
  `resource.k8s.io` DeviceClass with a valid name;
- `registrationDir` and `pluginDir`: where the driver looks for the kubelet's plugin watcher
  dir and keeps its own sockets (the standard dirs below /var/lib/kubelet by default). The
  kubelet dials the endpoint the driver names in GetInfo in its own view, so the plugin dir must
  be the kubelet's own path, as a DaemonSet's hostPath mounted at the same path gives it. It is
  the driver's own directory, strictly below the kubelet's plugins dir (`plugins/<driver>`):
  the plugins dir itself holds every other driver's, and a run removes only what it made.

A driver reaches the API server: its command may use the placeholders the target fills
(`{node_name}`, `{kube_api_server}`, `{kube_ca_file}`, `{kube_client_cert}`,
`{kube_client_key}`, `{kubeconfig}`), credentials of the target's own making, limited to a DRA
driver's rules.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hv_device_plugin.api.dra_wire import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from hvconform.contract.errors import ProfileError
from hvconform.contract.profile_rules import abs_dir, known_keys, resource_name, text
from hvconform.contract.safeyaml import UnsafeInput, excerpt, load_strict

API_DEVICE_PLUGIN = "deviceplugin"
API_DRA = "dra"
# What each API is, for reports and refusals.
API_TITLES = {
    API_DEVICE_PLUGIN: "the kubelet device plugin API (v1beta1)",
    API_DRA: "Dynamic Resource Allocation (kubelet DRA v1, resource.k8s.io/v1)",
}
# Filled by a target that runs a DRA driver (credentials and the node's name).
DRA_PLACEHOLDERS = ("node_name", "kube_api_server", "kube_ca_file", "kube_client_cert",
                    "kube_client_key", "kubeconfig")  # fmt: skip
_KEYS = {"driver", "extendedResource", "deviceClass", "registrationDir", "pluginDir"}
MAX_DEVICE_CLASS_BYTES = 64 * 1024  # a DeviceClass is a few hundred bytes; a profile's cap
# resource.k8s.io/v1, v1beta2, v1alpha3, ...: the API group DeviceClass belongs to
_RESOURCE_API_VERSION = re.compile(r"resource\.k8s\.io/v[1-9][0-9]*(?:(?:alpha|beta)[1-9][0-9]*)?")


@dataclass(frozen=True)
class DraDriver:
    driver: str
    extended_resource: str
    registration_dir: str = PLUGINS_REGISTRY_DIR
    plugin_dir: str = ""  # default: PLUGINS_DIR/<driver>
    device_class: str | None = None  # a manifest file with the driver's DeviceClass

    @property
    def endpoint_dir(self) -> str:
        return self.plugin_dir or posixpath.join(PLUGINS_DIR, self.driver)

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "extended_resource": self.extended_resource,
            "registration_dir": self.registration_dir,
            "plugin_dir": self.endpoint_dir,
            "device_class": self.device_class,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> DraDriver | None:
        if data is None:
            return None
        return cls(
            driver=data["driver"],
            extended_resource=data["extended_resource"],
            registration_dir=data["registration_dir"],
            plugin_dir=data["plugin_dir"],
            device_class=data["device_class"],
        )


def _driver_name(value: Any, where: str) -> str:
    name = text(value, where)
    # A driver name is a DNS subdomain (resource.k8s.io validation): the resource-name rule's
    # domain part, checked by giving it a name part.
    try:
        resource_name(f"{name}/x", where)
    except ProfileError:
        raise ProfileError(f"{where}: want a DNS subdomain, got {excerpt(name)}") from None
    return name


def _read_regular(path: str, where: str) -> bytes:
    """At most MAX_DEVICE_CLASS_BYTES of a regular file named itself: opened without following
    a symlink (a link to a secret is never read) and without blocking (a FIFO with no writer
    never hangs the load), refused unless fstat says regular (/dev/zero is never read)."""
    shown = excerpt(path, 120)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProfileError(
                f"{where}: {shown} is a symbolic link; name the file itself"
            ) from None
        raise ProfileError(f"{where}: {shown}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory
        os.close(fd)
        raise ProfileError(f"{where}: {shown} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_DEVICE_CLASS_BYTES + 1)  # bounded even if it grows meanwhile
    if len(data) > MAX_DEVICE_CLASS_BYTES:
        raise ProfileError(f"{where}: {shown} is larger than {MAX_DEVICE_CLASS_BYTES} bytes")
    return data


def load_device_class(path: str, where: str, extended_resource: str) -> dict[str, Any]:
    """The DeviceClass manifest at `path`, checked; ProfileError (one line) for anything else.

    Called when the profile is loaded and again by a target that applies it (the file is read
    afresh, with the same rules)."""
    try:
        doc = load_strict(_read_regular(path, where), f"{where} {excerpt(path, 120)}")
    except UnsafeInput as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ProfileError(
            f"{where}: want one DeviceClass manifest (a mapping), got {type(doc).__name__}"
        )
    api = doc.get("apiVersion")
    if not isinstance(api, str) or not _RESOURCE_API_VERSION.fullmatch(api):
        raise ProfileError(
            f"{where}.apiVersion: want resource.k8s.io/<version>, got {excerpt(api)}"
        )
    if doc.get("kind") != "DeviceClass":
        raise ProfileError(f"{where}.kind: want DeviceClass, got {excerpt(doc.get('kind'))}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise ProfileError(f"{where}.metadata: want a mapping with 'name'")
    _driver_name(meta.get("name"), f"{where}.metadata.name")  # a DNS subdomain as well
    spec = doc.get("spec", {})
    if not isinstance(spec, dict):
        raise ProfileError(f"{where}.spec: want a mapping")
    named = spec.get("extendedResourceName")
    if named != extended_resource:
        raise ProfileError(
            f"{where}.spec.extendedResourceName: want {excerpt(extended_resource)} "
            f"(dra.extendedResource: what the workload pods ask for), got {excerpt(named)}"
        )
    return doc


def parse_dra(value: Any, where: str, profile_dir: Path) -> DraDriver | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping with 'driver' and 'extendedResource'")
    known_keys(value, _KEYS, where)
    for key in ("driver", "extendedResource"):
        if key not in value:
            raise ProfileError(f"{where}: '{key}' is required for a DRA driver")
    driver = _driver_name(value["driver"], f"{where}.driver")
    registry = abs_dir(value.get("registrationDir", PLUGINS_REGISTRY_DIR),
                       f"{where}.registrationDir")  # fmt: skip
    plugin_dir = abs_dir(value.get("pluginDir", posixpath.join(PLUGINS_DIR, driver)),
                         f"{where}.pluginDir")  # fmt: skip
    if registry == plugin_dir or plugin_dir.startswith(registry + "/"):
        raise ProfileError(f"{where}.pluginDir: must not be the registration dir or inside it")
    if not plugin_dir.startswith(PLUGINS_DIR + "/"):
        # The plugins dir holds every driver's own dir: a run that took it as the driver's
        # would put its files among theirs (and once removed it all at teardown).
        raise ProfileError(
            f"{where}.pluginDir: want the driver's own dir strictly below {PLUGINS_DIR} "
            f"(as {PLUGINS_DIR}/{driver}), got {excerpt(plugin_dir)}"
        )
    if registry.startswith(plugin_dir + "/"):
        raise ProfileError(f"{where}.pluginDir: must not hold the registration dir")
    extended = resource_name(value["extendedResource"], f"{where}.extendedResource")
    klass = value.get("deviceClass")
    device_class = None
    if klass is not None:
        path = Path(text(klass, f"{where}.deviceClass"))
        device_class = str(path if path.is_absolute() else profile_dir / path)
        load_device_class(device_class, f"{where}.deviceClass", extended)
    return DraDriver(
        driver=driver,
        extended_resource=extended,
        registration_dir=registry,
        plugin_dir=plugin_dir,
        device_class=device_class,
    )
