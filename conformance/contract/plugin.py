"""The plugin under test, described once and shared by every target (csi-test's TestConfig).

A profile says how to start a plugin (argv run as is: nothing is appended), where it expects the
kubelet's plugin directory, the CDI directory, its hypervisor devices and optionally a host-device
view (defaults: the Kubernetes and CDI standard paths), and how its readiness and liveness can
be observed. What the plugin does not declare is discovered from the plugin itself: its resource
name and socket from its Register call, its CDI device names from Allocate answers, its spec
file from the CDI directory. `hvconform run --plugin-profile FILE` loads one; `--plugin-cmd`
derives one for this repository's flag convention; without either, the shipped profile of this
repository's plugin is used, through exactly the same path.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, DEVICE_PLUGIN_DIR
from hvconform.contract.datafiles import data_root
from hvconform.contract.deploy import Deploy, parse_deploy
from hvconform.contract.dra_profile import (
    API_DEVICE_PLUGIN,
    API_DRA,
    DRA_PLACEHOLDERS,
    DraDriver,
    parse_dra,
)
from hvconform.contract.errors import ProfileError as ProfileError
from hvconform.contract.profile_rules import HYPERVISOR_DEVICES as HYPERVISOR_DEVICES
from hvconform.contract.profile_rules import PROBE_TYPES as PROBE_TYPES
from hvconform.contract.profile_rules import ProbeType as ProbeType
from hvconform.contract.profile_rules import (
    abs_dir,
    argv,
    check_dirs,
    devices,
    env_map,
    known_keys,
    probe_fields,
    resource_name,
    text,
)
from hvconform.contract.safeyaml import UnsafeInput, excerpt, load_strict, read_bounded

# This repository's plugin's profiles: in the checkout's conformance/profiles, or the wheel's copy
# beside the chart their `deploy.chart.path` names (datafiles: the same relative path in both).
SHIPPED = data_root() / "conformance" / "profiles" / "hv-device-plugin.yaml"
# This repository's plugin in its DRA mode (`--mode dra`), a DRA driver's profile.
SHIPPED_DRA = SHIPPED.with_name("hv-dra-driver.yaml")
# Placeholders a command, an env value or a probe may use; each is filled by the target.
PLACEHOLDERS = ("python", "profile_dir", "health_addr", "health_host", "health_port",
                *DRA_PLACEHOLDERS)  # fmt: skip
_MAX_PROFILE_BYTES = 64 * 1024
_TOP_KEYS = {
    "name",
    "command",
    "env",
    "paths",
    "readiness",
    "liveness",
    "resource",
    "cdi",
    "deploy",
    "dra",
}
_PATH_KEYS = {"devicePluginDir", "cdiDir", "devices", "hostDevDir"}


@dataclass(frozen=True)
class Probe:
    """How one health condition is observed."""

    type: ProbeType = "none"
    url: str = ""  # http: a URL template, e.g. http://{health_addr}/readyz
    service: str = ""  # grpc-health: the service name asked on the plugin's own socket
    command: tuple[str, ...] = ()  # exec: run in the plugin's namespaces, exit 0 = healthy

    @property
    def observable(self) -> bool:
        return self.type != "none"


@dataclass(frozen=True)
class Paths:
    """Where the plugin looks, as its DaemonSet's hostPath volumes would give them."""

    device_plugin_dir: str = DEVICE_PLUGIN_DIR
    cdi_dir: str = CDI_DYNAMIC_DIR
    devices: tuple[str, ...] = ("/dev/kvm",)
    host_dev_dir: str | None = None  # a view of the host's /dev, if the plugin reads one


@dataclass(frozen=True)
class PluginUnderTest:
    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    paths: Paths = field(default_factory=Paths)
    readiness: Probe = field(default_factory=Probe)
    liveness: Probe = field(default_factory=Probe)
    resource: str | None = None  # discovered from Register when None
    cdi_kind: str | None = None  # discovered from Allocate answers when None
    cdi_spec: str | None = None  # discovered from the CDI directory when None
    deploy: Deploy | None = None  # how it runs in a container and on a cluster
    dra: DraDriver | None = None  # a DRA driver (dra_profile), not a device plugin
    source: str = ""  # where the description came from (a file, --plugin-cmd)
    profile_dir: str = "."

    @property
    def api(self) -> str:
        """The kubelet API the plugin speaks: a device plugin's, or DRA's."""
        return API_DEVICE_PLUGIN if self.dra is None else API_DRA

    @property
    def image(self) -> str | None:
        return None if self.deploy is None else self.deploy.image

    @property
    def uses_health_addr(self) -> bool:
        """True when anything refers to {health_addr}: the target must give the plugin one."""
        texts = [*self.command, *self.env.values(), self.readiness.url, self.liveness.url]
        return any("{health_" in t for t in texts)

    def fill(self, text: str, health_addr: str = "", facts: Mapping[str, str] | None = None) -> str:
        """The placeholders filled; `facts`: what a target gives a DRA driver (DRA_PLACEHOLDERS)."""
        host, _, port = health_addr.rpartition(":")
        values = {
            **(facts or {}),
            "python": sys.executable,
            "profile_dir": self.profile_dir,
            "health_addr": health_addr,
            "health_host": host,
            "health_port": port,
        }
        out = text
        for key, value in values.items():
            out = out.replace("{" + key + "}", value)
        return out

    def argv(self, health_addr: str = "", facts: Mapping[str, str] | None = None) -> list[str]:
        return [self.fill(a, health_addr, facts) for a in self.command]

    def environment(
        self, health_addr: str = "", facts: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        return {k: self.fill(v, health_addr, facts) for k, v in self.env.items()}

    def with_image(self, image: str) -> PluginUnderTest:
        """The documented override of deploy.image (--image); unchanged without a deploy."""
        if self.deploy is None or not image:
            return self
        return replace(self, deploy=replace(self.deploy, image=image))

    def with_env(self, **extra: str) -> PluginUnderTest:
        return replace(self, env={**self.env, **extra})

    def summary(self) -> dict[str, Any]:
        """What results.json records about the plugin under test."""
        return {
            "name": self.name,
            "source": self.source,
            "command": shlex.join(self.command),
            "paths": {
                "devicePluginDir": self.paths.device_plugin_dir,
                "cdiDir": self.paths.cdi_dir,
                "devices": list(self.paths.devices),
                "hostDevDir": self.paths.host_dev_dir,
            },
            "readiness": self.readiness.type,
            "liveness": self.liveness.type,
            "image": self.image,
            "api": self.api,
            **({"driver": self.dra.driver} if self.dra is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """Everything, as the run context stores it (from_json reads it back unchanged)."""
        return {
            "name": self.name,
            "command": list(self.command),
            "env": dict(self.env),
            "paths": {
                "device_plugin_dir": self.paths.device_plugin_dir,
                "cdi_dir": self.paths.cdi_dir,
                "devices": list(self.paths.devices),
                "host_dev_dir": self.paths.host_dev_dir,
            },
            "readiness": _probe_json(self.readiness),
            "liveness": _probe_json(self.liveness),
            "resource": self.resource,
            "cdi_kind": self.cdi_kind,
            "cdi_spec": self.cdi_spec,
            "deploy": None if self.deploy is None else self.deploy.to_json(),
            "dra": None if self.dra is None else self.dra.to_json(),
            "source": self.source,
            "profile_dir": self.profile_dir,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PluginUnderTest:
        paths = data["paths"]
        return cls(
            name=data["name"],
            command=tuple(data["command"]),
            env=dict(data["env"]),
            paths=Paths(
                paths["device_plugin_dir"],
                paths["cdi_dir"],
                tuple(paths["devices"]),
                paths["host_dev_dir"],
            ),
            readiness=_probe_from(data["readiness"]),
            liveness=_probe_from(data["liveness"]),
            resource=data["resource"],
            cdi_kind=data["cdi_kind"],
            cdi_spec=data["cdi_spec"],
            deploy=None if data["deploy"] is None else Deploy.from_json(data["deploy"]),
            dra=DraDriver.from_json(data.get("dra")),
            source=data["source"],
            profile_dir=data["profile_dir"],
        )


def _probe_json(probe: Probe) -> dict[str, Any]:
    return {"type": probe.type, "url": probe.url, "service": probe.service,
            "command": list(probe.command)}  # fmt: skip


def _probe_from(data: Mapping[str, Any]) -> Probe:
    return Probe(data["type"], data["url"], data["service"], tuple(data["command"]))


def from_plugin_cmd(cmd: str) -> PluginUnderTest:
    """A plugin that speaks this repository's flags: the shipped profile (its paths, probes and
    flags) with `cmd` in place of the command that starts this repository's plugin. The flag
    convention lives in the shipped profile only; this shortcut has no deploy section (a
    command is not an image)."""
    try:
        base = shlex.split(cmd)
    except ValueError as exc:
        raise ProfileError(f"--plugin-cmd: {exc}") from None
    if not base:
        raise ProfileError("--plugin-cmd is empty")
    shipped = load_profile(SHIPPED)
    # after `{python} -m hv_device_plugin`
    flags = shipped.command[shipped.command.index("hv_device_plugin") + 1 :]
    return replace(
        shipped,
        name=PurePosixPath(base[0]).name if len(base) == 1 else shlex.join(base[:3]),
        command=(*base, *flags),
        deploy=None,
        source=f"--plugin-cmd {cmd}",
    )


def load_profile(path: Path | str) -> PluginUnderTest:
    """Read and validate a profile file; ProfileError (one line) for anything unusable: a file
    that is not regular (a FIFO, a device) or too large, YAML with aliases, duplicate keys or
    huge integers, and any value the rules below refuse. Errors quote the file only through
    short escaped excerpts."""
    shown = str(path)
    where = shown if shown.isprintable() and len(shown) <= 200 else excerpt(shown, 120)
    try:
        data = load_strict(read_bounded(path, _MAX_PROFILE_BYTES), where)
    except UnsafeInput as exc:
        raise ProfileError(str(exc)) from None
    return parse_profile(data, where, Path(path).resolve().parent)


def _probe(value: Any, where: str) -> Probe:
    kind, url, service, command = probe_fields(value, where)
    return Probe(kind, url, service, command)


def _paths(value: Any, where: str) -> Paths:
    if value is None:
        return Paths()
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping")
    known_keys(value, _PATH_KEYS, where)
    host_dev = value.get("hostDevDir")
    paths = Paths(
        device_plugin_dir=abs_dir(
            value.get("devicePluginDir", DEVICE_PLUGIN_DIR), f"{where}.devicePluginDir"
        ),
        cdi_dir=abs_dir(value.get("cdiDir", CDI_DYNAMIC_DIR), f"{where}.cdiDir"),
        devices=devices(value.get("devices", ["/dev/kvm"]), f"{where}.devices"),
        host_dev_dir=None if host_dev is None else abs_dir(host_dev, f"{where}.hostDevDir"),
    )
    dirs = [paths.device_plugin_dir, paths.cdi_dir]
    check_dirs([*dirs, paths.host_dev_dir] if paths.host_dev_dir else dirs, where)
    return paths


def parse_profile(data: Any, where: str, profile_dir: Path) -> PluginUnderTest:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: want a mapping at the top level (a plugin profile)")
    if "command" not in data:
        # Nothing of the file is echoed: a file that is no profile at all (a symlink to a
        # secret, say) must not have its keys printed.
        raise ProfileError(f"{where}: not a plugin profile: no 'command' key")
    known_keys(data, _TOP_KEYS, where)
    cdi = data.get("cdi") or {}
    if not isinstance(cdi, dict):
        raise ProfileError(f"{where}.cdi: want a mapping with 'kind' and/or 'spec'")
    known_keys(cdi, {"kind", "spec"}, f"{where}.cdi")
    spec = cdi.get("spec")
    if spec is not None and ("/" in text(spec, f"{where}.cdi.spec") or spec in (".", "..")):
        raise ProfileError(f"{where}.cdi.spec: want a file name in the CDI directory")
    resource = data.get("resource")
    dra = parse_dra(data.get("dra"), f"{where}.dra", profile_dir)
    if dra is not None:
        # A DRA driver's workloads ask for the DeviceClass's extended resource.
        if resource is not None and resource != dra.extended_resource:
            raise ProfileError(f"{where}.resource: a DRA driver's is dra.extendedResource")
        resource = dra.extended_resource
    return PluginUnderTest(
        name=text(data.get("name", profile_dir.name), f"{where}.name"),
        command=argv(data.get("command"), f"{where}.command"),
        env=env_map(data.get("env"), f"{where}.env"),
        paths=_paths(data.get("paths"), f"{where}.paths"),
        readiness=_probe(data.get("readiness"), f"{where}.readiness"),
        liveness=_probe(data.get("liveness"), f"{where}.liveness"),
        resource=None if resource is None else resource_name(resource, f"{where}.resource"),
        cdi_kind=None
        if cdi.get("kind") is None
        else resource_name(cdi["kind"], f"{where}.cdi.kind"),
        cdi_spec=spec,
        deploy=parse_deploy(data.get("deploy"), f"{where}.deploy", profile_dir),
        dra=dra,
        source=where,
        profile_dir=str(profile_dir),
    )


def shipped_profiles() -> list[PluginUnderTest]:
    """This repository's profiles, loaded; ProfileError (one line, naming the file and what
    is missing) when the installed suite lacks its data."""
    try:
        return [load_profile(path) for path in (SHIPPED, SHIPPED_DRA)]
    except ProfileError as exc:
        raise ProfileError(
            f"the suite's own profile is unusable, its data is missing (reinstall "
            f"hv-device-plugin, built with its data: setup.py): {exc}"
        ) from None


def resolve(plugin_profile: str = "", plugin_cmd: str = "") -> PluginUnderTest:
    """The plugin under test from the run's options: a profile file, a command, or ours.

    The shipped profiles are loaded too, whatever the run's: every run's results compare the
    plugin with them (is it this repository's?), so a suite installed without its data (the
    chart, the profiles: hvconform.contract.datafiles) stops here, before anything runs, with
    one line, never with a traceback from inside the run."""
    if plugin_profile and plugin_cmd:
        raise ProfileError("--plugin-profile and --plugin-cmd are exclusive: give one")
    shipped_profiles()
    if plugin_cmd:
        return from_plugin_cmd(plugin_cmd)
    return load_profile(plugin_profile or SHIPPED)
