"""The rules a plugin profile's values must meet, each refusing with one line (ProfileError).

Kept apart from the profile's dataclasses (hvconform.contract.plugin) so each rule is written
once and tested alone. What they refuse, and why:
- directories: absolute and normalised (no `..`, no trailing or doubled slash: `//dev` is
  `/dev`), distinct and not nested in one another, never `/` nor under /dev (it would hide the
  plugin's devices) or the kernel's and the system's own trees (/proc, /sys, /etc, ...);
- env: POSIX names (no `=`, no NUL: the kernel would split or cut them), values without NUL;
- an http probe only to the plugin's own address ({health_addr}, {health_host}) or loopback: the
  harness probes from the host's network namespace and must never be sent elsewhere;
- a resource name the kubelet accepts as an extended resource (a DNS subdomain prefix, a name
  of at most 63 characters, not in the kubernetes.io or k8s.io domains);
- every echoed value is a short escaped excerpt.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from hvconform.contract.errors import ProfileError
from hvconform.contract.safeyaml import excerpt

ProbeType = Literal["http", "grpc-health", "exec", "none"]
PROBE_TYPES: tuple[str, ...] = ("http", "grpc-health", "exec", "none")
HYPERVISOR_DEVICES = ("/dev/kvm", "/dev/mshv")
# Trees a plugin's directories must not be: the kernel's, the system's, and /dev.
SYSTEM_TREES = ("/dev", "/proc", "/sys", "/etc", "/boot", "/usr", "/bin", "/sbin", "/lib",
                "/lib64")  # fmt: skip
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "{health_host}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
MAX_ARGS = 256
MAX_TEXT = 4096


def text(value: Any, where: str) -> str:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise ProfileError(f"{where}: longer than {MAX_TEXT} characters: {excerpt(value)}")
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ProfileError(f"{where}: want a non-empty string, got {excerpt(value)}")
    return value


def known_keys(value: Mapping[Any, Any], allowed: set[str], where: str) -> None:
    unknown = [k for k in value if k not in allowed]
    if unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise ProfileError(
            f"{where}: unknown key {excerpt(unknown[0])}{more}; known: {', '.join(sorted(allowed))}"
        )


def abs_dir(value: Any, where: str) -> str:
    path = text(value, where)
    if (
        not path.startswith("/")
        or path.startswith("//")
        or posixpath.normpath(path) != path
        or path == "/"
    ):
        raise ProfileError(f"{where}: want a normalised absolute directory, got {excerpt(path)}")
    if any(path == tree or path.startswith(tree + "/") for tree in SYSTEM_TREES):
        raise ProfileError(f"{where}: {excerpt(path)} is a system tree (/dev, /proc, /etc, ...)")
    return path


def check_dirs(dirs: list[str], where: str) -> None:
    """Distinct and none inside another: a plugin dir inside the CDI dir would be a spec."""
    for i, a in enumerate(dirs):
        for b in dirs[i + 1 :]:
            if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                raise ProfileError(
                    f"{where}: the plugin, CDI and host-device directories must differ and not "
                    f"nest ({excerpt(a)} and {excerpt(b)})"
                )


def argv(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_ARGS:
        raise ProfileError(f"{where}: want a list of 1..{MAX_ARGS} strings (argv, run as is)")
    return tuple(text(v, f"{where}[{i}]") for i, v in enumerate(value))


def env_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping of names to strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
            raise ProfileError(f"{where}: {excerpt(k)} is not an environment variable name")
        if not isinstance(v, str) or "\x00" in v or len(v) > MAX_TEXT:
            raise ProfileError(f"{where}.{k}: want a string without NUL, got {excerpt(v)}")
        out[k] = v
    return out


def _http_url(url: str, where: str) -> str:
    if not url.startswith("http://"):
        raise ProfileError(f"{where}: want an http:// URL template, got {excerpt(url)}")
    authority = url[len("http://") :].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if authority == "{health_addr}":
        return url
    # {health_host} only as the whole host (before a port): with userinfo
    # ("{health_host}@10.0.0.1") or a suffix ("{health_host}.example.com") it would send the
    # probe elsewhere once filled.
    if "@" in authority or ("{health_host}" in authority and not re.fullmatch(
        r"\{health_host\}(:(\d{1,5}|\{health_port\}))?", authority
    )):  # fmt: skip
        raise ProfileError(
            f"{where}: the probe must stay on the plugin's own address ({{health_addr}}) or "
            f"loopback, got {excerpt(authority)}"
        )
    if authority.startswith("{health_host}"):
        return url
    try:
        host = urlsplit("http://" + authority.replace("{health_port}", "1")).hostname or ""
    except ValueError:  # an unbalanced IPv6 bracket, say
        raise ProfileError(f"{where}: not a URL: {excerpt(url)}") from None
    host = f"[{host}]" if ":" in host else host
    if host not in LOOPBACK_HOSTS:
        raise ProfileError(
            f"{where}: the probe must stay on the plugin's own address ({{health_addr}}) or "
            f"loopback, got host {excerpt(host)}"
        )
    return url


def probe_fields(value: Any, where: str) -> tuple[ProbeType, str, str, tuple[str, ...]]:
    """(type, url, service, command) of a readiness or liveness probe."""
    if value is None or value == "none":
        return "none", "", "", ()
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping with 'type', got {excerpt(value)}")
    kind = value.get("type")
    if kind not in PROBE_TYPES:
        raise ProfileError(
            f"{where}.type: want one of {', '.join(PROBE_TYPES)}, got {excerpt(kind)}"
        )
    allowed = {"http": {"url"}, "grpc-health": {"service"}, "exec": {"command"}, "none": set()}
    known_keys(value, {"type", *allowed[kind]}, where)
    if kind == "http":
        return "http", _http_url(text(value.get("url"), f"{where}.url"), f"{where}.url"), "", ()
    if kind == "grpc-health":
        service = value.get("service", "")
        if not isinstance(service, str) or len(service) > 256 or "\x00" in service:
            raise ProfileError(f"{where}.service: want a service name, got {excerpt(service)}")
        return "grpc-health", "", service, ()
    if kind == "exec":
        return "exec", "", "", argv(value.get("command"), f"{where}.command")
    return "none", "", "", ()


def resource_name(value: Any, where: str) -> str:
    """An extended resource name the kubelet registers (domain/name, not a native domain)."""
    name = text(value, where)
    prefix, slash, short = name.partition("/")
    if (
        not slash
        or not _DNS_SUBDOMAIN.fullmatch(prefix)
        or not _QUALIFIED_NAME.fullmatch(short)
        or prefix in ("kubernetes.io", "k8s.io")
        or prefix.endswith((".kubernetes.io", ".k8s.io"))
    ):
        raise ProfileError(
            f"{where}: {excerpt(name)} is not an extended resource name the kubelet accepts "
            "(lower-case domain/name, not kubernetes.io or k8s.io)"
        )
    return name


def devices(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or len(value) > len(HYPERVISOR_DEVICES):
        raise ProfileError(f"{where}: want a list of /dev/kvm and/or /dev/mshv")
    for i, dev in enumerate(value):
        if dev not in HYPERVISOR_DEVICES:
            raise ProfileError(
                f"{where}[{i}]: only {' and '.join(HYPERVISOR_DEVICES)} are accepted, "
                f"got {excerpt(dev)}"
            )
    if len(set(value)) != len(value):
        raise ProfileError(f"{where}: a device is listed twice")
    return tuple(value)
