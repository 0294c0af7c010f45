"""Every option once: its flag, its HV_ environment variable, its default and its validation."""

from __future__ import annotations

import argparse
import functools
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ALLOWED_DEVICES = ("/dev/kvm", "/dev/mshv")
HYPERVISOR_RESOURCE = "hyperlight.dev/hypervisor"
DEVICE_ACCESS_RESOURCE = "hyperlight.dev/device-access"
DEFAULT_PROBE_MAX_AGE_S = 0.02
MAX_PROBE_AGE_S = 1.0
CDI_VERSIONS = ("0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


class ConfigError(Exception):
    """A configuration value that must stop the process before it writes anything."""


@dataclass(frozen=True)
class Config:
    mode: str
    hypervisor_device: str
    resource_name: str
    slots: int
    device_plugin_dir: Path
    cdi_dir: Path
    cdi_version: str
    cdi_filename: str
    device_uid: int
    device_gid: int
    host_dev_dir: Path | None
    probe_timeout_s: float
    probe_max_age_s: float
    recheck_interval_s: float
    health_addr: str
    register_attempts: int
    register_backoff_initial_s: float
    register_backoff_max_s: float
    register_attempt_timeout_s: float
    log_level: str

    @functools.cached_property
    def device_name(self) -> str:
        return Path(self.hypervisor_device).name

    @property
    def socket_prefix(self) -> str:
        return "hyperlight-access" if self.mode == "device-access" else "hyperlight"

    @property
    def host_view_path(self) -> Path | None:
        return None if self.host_dev_dir is None else self.host_dev_dir / self.device_name


@dataclass(frozen=True)
class _Opt:
    flag: str
    default: str
    help: str


_OPTIONS: tuple[_Opt, ...] = (
    _Opt(
        "mode",
        "hypervisor",
        "hypervisor (advertise hyperlight.dev/hypervisor, inject by CDI) "
        "or device-access (bootstrap: one device, DeviceSpec, for the plugin pod itself)",
    ),
    _Opt(
        "hypervisor-device",
        "/dev/kvm",
        "/dev/kvm, /dev/mshv or auto (prefers /dev/mshv); nothing else is ever accepted",
    ),
    _Opt(
        "resource-name",
        "",
        "extended resource to advertise (default: hyperlight.dev/hypervisor, "
        "or hyperlight.dev/device-access in device-access mode)",
    ),
    _Opt("slots", "2000", "how many device IDs to advertise (hypervisor mode)"),
    _Opt("device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin dir"),
    _Opt("cdi-dir", "/var/run/cdi", "directory holding the one CDI spec this plugin owns"),
    _Opt(
        "cdi-version",
        "0.5.0",
        "cdiVersion written into the spec (lowest the content needs "
        "is 0.5.0; podman 4.3 resolves up to 0.5.0)",
    ),
    _Opt("cdi-filename", "hyperlight.json", "file name of the owned CDI spec"),
    _Opt("device-uid", "65534", "uid the runtime gives the device node inside workloads"),
    _Opt("device-gid", "65534", "gid the runtime gives the device node inside workloads"),
    _Opt(
        "host-dev-dir",
        "",
        "read-only view of the host's /dev used for identity checks "
        "(empty: identity is checked on the device path alone)",
    ),
    _Opt("probe-timeout", "2.0", "deadline in seconds of one device usability probe"),
    _Opt(
        "probe-max-age",
        f"{DEFAULT_PROBE_MAX_AGE_S:g}",
        "seconds: an Allocate may be answered by a passed probe that started at most this "
        "long before it arrived (bursts share one KVM_CREATE_VM); a host /dev or mount-table "
        "event voids it at once; 0 probes for every Allocate or joins the probe in flight",
    ),
    _Opt(
        "recheck-interval",
        "5.0",
        "seconds between periodic device and CDI re-checks "
        "(inotify and mount-table events trigger checks sooner)",
    ),
    _Opt(
        "health-addr",
        "127.0.0.1:8080",
        "host:port for /healthz /readyz /metrics (empty disables the HTTP endpoints)",
    ),
    _Opt(
        "register-attempts",
        "8",
        "registration attempts before giving up until the kubelet socket changes",
    ),
    _Opt("register-backoff-initial", "0.2", "first backoff in seconds (doubles, with jitter)"),
    _Opt("register-backoff-max", "5.0", "largest backoff in seconds"),
    _Opt("register-attempt-timeout", "5.0", "deadline in seconds of one Register call"),
    _Opt("log-level", "info", "debug, info, warning or error"),
)


def env_name(flag: str) -> str:
    return "HV_" + flag.upper().replace("-", "_")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hv-device-plugin",
        description="Kubernetes device plugin for hypervisor devices (/dev/kvm, /dev/mshv). "
        "Every flag can also be set by the environment variable shown in brackets.",
        epilog="Subcommand: 'hv-device-plugin probe liveness|readiness' asks a running plugin "
        "over gRPC Health on its socket (exit 0 when SERVING); use it as an exec probe.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for opt in _OPTIONS:
        parser.add_argument(
            f"--{opt.flag}",
            default=environ.get(env_name(opt.flag), opt.default),
            help=f"{opt.help} [{env_name(opt.flag)}]",
        )
    return parser


def _number(raw: str, flag: str, kind: type[int] | type[float], minimum: float) -> float:
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"--{flag}: {raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"--{flag}: {value} is below the minimum {minimum}")
    return value


def resolve_hypervisor_device(raw: str, host_dev_dir: Path | None) -> str:
    """Accept exactly /dev/kvm or /dev/mshv (or auto); refuse anything a symlink could redirect."""
    if raw == "auto":
        root = host_dev_dir if host_dev_dir is not None else Path("/dev")
        for candidate in ("/dev/mshv", "/dev/kvm"):
            try:
                st = (root / Path(candidate).name).lstat()
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                return candidate
        raise ConfigError(f"--hypervisor-device auto: no /dev/mshv or /dev/kvm under {root}")
    # Exact string comparison on purpose: no normalisation, so "dev/kvm", "/dev/kvm/../null"
    # or "/dev//kvm" can never be reinterpreted as an accepted path.
    if raw not in ALLOWED_DEVICES:
        raise ConfigError(
            f"--hypervisor-device {raw!r} refused: only /dev/kvm and /dev/mshv are accepted"
        )
    try:
        st = os.lstat(raw)
    except FileNotFoundError:
        return raw  # may appear later; the device check reports it meanwhile
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"--hypervisor-device {raw} refused: it is a symlink")
    if not stat.S_ISCHR(st.st_mode):
        raise ConfigError(f"--hypervisor-device {raw} refused: it is not a character device")
    return raw


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    ns = build_parser(env).parse_args(list(argv))
    mode = str(ns.mode)
    if mode not in ("hypervisor", "device-access"):
        raise ConfigError(f"--mode {mode!r} refused: use hypervisor or device-access")
    host_dev_dir = Path(ns.host_dev_dir) if ns.host_dev_dir else None
    if host_dev_dir is not None and not host_dev_dir.is_absolute():
        raise ConfigError(f"--host-dev-dir {ns.host_dev_dir!r} must be an absolute path")
    # In device-access mode the plugin has no device of its own: auto looks at the host view.
    device = resolve_hypervisor_device(
        str(ns.hypervisor_device), host_dev_dir if mode == "device-access" else None
    )
    default_resource = DEVICE_ACCESS_RESOURCE if mode == "device-access" else HYPERVISOR_RESOURCE
    resource = str(ns.resource_name) or default_resource
    if "/" not in resource:
        raise ConfigError(f"--resource-name {resource!r} must be vendor-domain/name")
    if ns.cdi_version not in CDI_VERSIONS:
        raise ConfigError(f"--cdi-version {ns.cdi_version!r}: use one of {', '.join(CDI_VERSIONS)}")
    filename = str(ns.cdi_filename)
    if "/" in filename or not filename.endswith((".json", ".yaml")) or filename.startswith("."):
        raise ConfigError(f"--cdi-filename {filename!r} must be a plain *.json or *.yaml name")
    # Beyond a second the "probe before every allocation" promise would no longer hold.
    if _number(ns.probe_max_age, "probe-max-age", float, 0.0) > MAX_PROBE_AGE_S:
        raise ConfigError(f"--probe-max-age: {ns.probe_max_age} is above the maximum 1.0")
    if str(ns.log_level).lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level {ns.log_level!r}: use debug, info, warning or error")
    for flag in ("device-plugin-dir", "cdi-dir"):
        if not Path(getattr(ns, flag.replace("-", "_"))).is_absolute():
            raise ConfigError(f"--{flag} must be an absolute path")
    # sun_path holds 107 bytes plus NUL; the socket name adds the prefix, 8 hex digits and ".sock".
    longest = len(str(ns.device_plugin_dir).rstrip("/")) + len("/hyperlight-access-12345678.sock")
    if longest > 107:
        raise ConfigError(
            f"--device-plugin-dir {ns.device_plugin_dir!r} is too long for a unix socket path "
            f"({longest} > 107 bytes)"
        )
    return Config(
        mode=mode,
        hypervisor_device=device,
        resource_name=resource,
        slots=1 if mode == "device-access" else int(_number(ns.slots, "slots", int, 1)),
        device_plugin_dir=Path(ns.device_plugin_dir),
        cdi_dir=Path(ns.cdi_dir),
        cdi_version=str(ns.cdi_version),
        cdi_filename=filename,
        device_uid=int(_number(ns.device_uid, "device-uid", int, 0)),
        device_gid=int(_number(ns.device_gid, "device-gid", int, 0)),
        host_dev_dir=host_dev_dir,
        probe_timeout_s=_number(ns.probe_timeout, "probe-timeout", float, 0.05),
        probe_max_age_s=_number(ns.probe_max_age, "probe-max-age", float, 0.0),
        recheck_interval_s=_number(ns.recheck_interval, "recheck-interval", float, 0.1),
        health_addr=str(ns.health_addr),
        register_attempts=int(_number(ns.register_attempts, "register-attempts", int, 1)),
        register_backoff_initial_s=_number(
            ns.register_backoff_initial, "register-backoff-initial", float, 0.01
        ),
        register_backoff_max_s=_number(
            ns.register_backoff_max, "register-backoff-max", float, 0.01
        ),
        register_attempt_timeout_s=_number(
            ns.register_attempt_timeout, "register-attempt-timeout", float, 0.1
        ),
        log_level=str(ns.log_level).lower(),
    )
