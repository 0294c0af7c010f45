"""The plugin's options, each once: flag, HV_ environment variable, default, bounds, help.

Bounds are facts the help text shows and hv_device_plugin.config enforces; nothing here reads a value.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NoReturn

from hv_device_plugin.api.dra_wire import PLUGINS_REGISTRY_DIR
from hv_device_plugin.api.names import DRA_DRIVER, SPEC_FILENAME
from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, DEVICE_PLUGIN_DIR
from hv_device_plugin.cdi_spec import UINT32_MAX
from hv_device_plugin.inputs import printable

ALLOWED_DEVICES = ("/dev/kvm", "/dev/mshv")
DEFAULT_PROBE_MAX_AGE_S = 0.02
MAX_PROBE_AGE_S = 1.0
CDI_VERSIONS = ("0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
# One slot is one container holding the device. Kubernetes is tested to 110 pods per node (the
# kubelet's default --max-pods); 10,000 covers a node raised to 1,000 pods with 10 such
# containers each, and keeps a ListAndWatch snapshot (~24 bytes a device) far below the
# kubelet's 4 MiB gRPC receive limit. It also bounds every request (hv_device_plugin.request_checks).
MAX_SLOTS = 10_000
# CDI stores uid/gid as uint32; 2**32-1 is (uid_t)-1, which chown reads as "leave unchanged".
MAX_ID = UINT32_MAX - 1
# NAME_MAX is 255, and the temporary file beside the spec adds about 30 characters.
MAX_CDI_FILENAME = 200
# sun_path holds 107 bytes plus NUL; the socket name adds the prefix, 8 hex digits and ".sock".
SUN_PATH_MAX = 107
LONGEST_SOCKET_NAME = len("/hyperlight-access-12345678.sock")
MAX_REGISTER_ATTEMPTS = 1000
# Durations: (minimum, maximum) in seconds. A Register the kubelet has not answered within its
# own 10 s dial timeout never will be; a backoff longer than the kubelet's 5 min grace period
# loses the resource; a probe (one KVM_CREATE_VM) taking a minute is a hung kernel.
PROBE_TIMEOUT_S = (0.05, 60.0)
PROBE_MAX_AGE_S = (0.0, MAX_PROBE_AGE_S)
RECHECK_INTERVAL_S = (0.1, 3600.0)
REGISTER_BACKOFF_S = (0.01, 300.0)
REGISTER_ATTEMPT_TIMEOUT_S = (0.1, 60.0)
# An empty host in --health-addr (":8080") means loopback, never every interface.
DEFAULT_HEALTH_HOST = "127.0.0.1"


class ConfigError(Exception):
    """A configuration value that must stop the process before it writes anything."""


# The exit code of a refused configuration or argument: one line on stderr, nothing created.
EXIT_CONFIG = 2


def env_name(flag: str) -> str:
    return "HV_" + flag.upper().replace("-", "_")


def flag_label(flag: str, from_env: frozenset[str]) -> str:
    """`--flag`, or `--flag (set by HV_FLAG)` when the environment gave the value."""
    return f"--{flag} (set by {env_name(flag)})" if flag in from_env else f"--{flag}"


@dataclass(frozen=True)
class _Opt:
    flag: str
    default: str
    help: str


def _secs(bounds: tuple[float, float]) -> str:
    return f"seconds, {bounds[0]:g} to {bounds[1]:g}"


OPTIONS: tuple[_Opt, ...] = (
    _Opt(
        "mode",
        "hypervisor",
        "hypervisor (advertise hyperlight.dev/hypervisor, inject by CDI), "
        "device-access (bootstrap: one device, DeviceSpec, for the plugin pod itself) "
        "or dra (a DRA driver: plugin registration, NodePrepareResources, the node's "
        "ResourceSlice; needs --node-name)",
    ),
    _Opt(
        "hypervisor-device",
        "/dev/kvm",
        "/dev/kvm, /dev/mshv or auto (prefers /dev/mshv); nothing else is ever accepted",
    ),
    _Opt(
        "resource-name",
        "",
        "extended resource to advertise, DOMAIN/NAME by the kubelet's rules, not kubernetes.io "
        "(empty: hyperlight.dev/hypervisor, or hyperlight.dev/device-access in device-access mode)",
    ),
    _Opt(
        "slots",
        "2000",
        f"device IDs to advertise (hypervisor mode), 1 to {MAX_SLOTS}: one per container holding "
        f"the device; {MAX_SLOTS} is 1,000 pods of 10 such containers, 9 times the kubelet's "
        "default --max-pods of 110. Also the most IDs one Allocate may name",
    ),
    _Opt(
        "device-plugin-dir",
        DEVICE_PLUGIN_DIR,
        "kubelet's device plugin dir: an existing, writable directory, not a symlink",
    ),
    _Opt(
        "cdi-dir",
        CDI_DYNAMIC_DIR,
        "directory holding the one CDI spec this plugin owns: existing, writable, not a symlink",
    ),
    _Opt(
        "cdi-version",
        "0.5.0",
        "cdiVersion written into the spec (lowest the content needs "
        "is 0.5.0; podman 4.3 resolves up to 0.5.0)",
    ),
    _Opt("cdi-filename", SPEC_FILENAME, "file name of the owned CDI spec (*.json or *.yaml)"),
    _Opt("device-uid", "65534", f"uid of the device node inside workloads, 0 to {MAX_ID}"),
    _Opt("device-gid", "65534", f"gid of the device node inside workloads, 0 to {MAX_ID}"),
    _Opt(
        "host-dev-dir",
        "",
        "read-only view of the host's /dev used for identity checks, an existing directory "
        "(empty: identity is checked on the device path alone)",
    ),
    _Opt(
        "probe-timeout",
        "2.0",
        f"deadline of one device usability probe ({_secs(PROBE_TIMEOUT_S)})",
    ),
    _Opt(
        "probe-max-age",
        f"{DEFAULT_PROBE_MAX_AGE_S:g}",
        f"{_secs(PROBE_MAX_AGE_S)}: an Allocate may be answered by a passed probe that started "
        "at most this long before it arrived (bursts share one KVM_CREATE_VM); a host /dev or "
        "mount-table event voids it at once; 0 probes for every Allocate or joins the probe in "
        "flight",
    ),
    _Opt(
        "recheck-interval",
        "5.0",
        f"time between periodic device, CDI and kubelet-socket re-checks "
        f"({_secs(RECHECK_INTERVAL_S)}; inotify and mount-table events trigger them sooner)",
    ),
    _Opt(
        "health-addr",
        "127.0.0.1:8080",
        "HOST:PORT or [IPV6]:PORT for /healthz /readyz /metrics, bound before start-up (a port "
        "in use is a configuration error); port 0 picks a free one; empty disables them",
    ),
    _Opt(
        "register-attempts",
        "8",
        f"registration attempts (1 to {MAX_REGISTER_ATTEMPTS}) before giving up until the "
        "kubelet socket changes",
    ),
    _Opt(
        "register-backoff-initial",
        "0.2",
        f"first backoff ({_secs(REGISTER_BACKOFF_S)}; doubles, with jitter)",
    ),
    _Opt(
        "register-backoff-max",
        "5.0",
        f"largest backoff ({_secs(REGISTER_BACKOFF_S)}, not below the first)",
    ),
    _Opt(
        "register-attempt-timeout",
        "5.0",
        f"deadline of one Register call ({_secs(REGISTER_ATTEMPT_TIMEOUT_S)})",
    ),
    _Opt("log-level", "info", "debug, info, warning or error"),
    # --mode dra only
    _Opt("driver-name", DRA_DRIVER, "dra: the DRA driver name, a DNS subdomain of at most 63"),
    _Opt("node-name", "", "dra: this node's name (its ResourceSlice's node and pool); required"),
    _Opt(
        "plugins-registry-dir",
        PLUGINS_REGISTRY_DIR,
        "dra: the kubelet's plugin registration dir: existing, writable, not a symlink",
    ),
    _Opt(
        "dra-plugin-dir",
        "",
        "dra: the driver's own dir (its DRAPlugin socket, its prepared-claims state): existing, "
        "writable, not a symlink (empty: /var/lib/kubelet/plugins/<driver name>)",
    ),
    _Opt(
        "kube-api-server",
        "",
        "dra: the API server, https://HOST[:PORT] with HOST a DNS name, an IPv4 address or "
        "[IPv6], PORT 1-65535; no credentials, path, query or fragment (empty: in-cluster, from "
        "the pod's service account)",
    ),
    _Opt("kube-ca-file", "", "dra, with --kube-api-server: the API server's CA bundle"),
    _Opt("kube-token-file", "", "dra, with --kube-api-server: a bearer token file"),
    _Opt("kube-client-cert", "", "dra, with --kube-api-server: a client certificate file"),
    _Opt("kube-client-key", "", "dra, with --kube-client-cert: its key file"),
)
DEFAULTS = {opt.flag: opt.default for opt in OPTIONS}


class OneLineParser(argparse.ArgumentParser):
    """argparse that refuses in one line (ConfigError) instead of usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(printable(message))  # it may quote any argument given


class _Version(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from hv_device_plugin.version import source_commit, version

        print(f"hv-device-plugin {version()} (source commit {source_commit()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="hv-device-plugin",
        description="Kubernetes device plugin for hypervisor devices (/dev/kvm, /dev/mshv). "
        "Every flag can also be set by the environment variable shown in brackets; the flag "
        "wins. Every value is checked before anything is written.",
        epilog="Exit codes: 0 stopped by SIGTERM or SIGINT; 2 configuration refused (one line "
        "on stderr naming the flag, and its variable when that set it); 3 unclean stop. "
        "Subcommand: 'hv-device-plugin probe liveness|readiness' asks a running plugin "
        "over gRPC Health on its socket (exit 0 when SERVING); use it as an exec probe.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print version and source commit, exit 0"
    )
    for opt in OPTIONS:
        default = repr(opt.default) if opt.default else "empty"
        parser.add_argument(
            f"--{opt.flag}", help=f"{opt.help} (default: {default}) [{env_name(opt.flag)}]"
        )
    return parser
