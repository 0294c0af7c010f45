"""Parsing and checking of every option value (hv_device_plugin.options defines the options).

parse_config checks every value's syntax and range and touches nothing; hv_device_plugin.preflight then
checks the directories and binds the health port. Both run before anything is created.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

from hv_device_plugin.api.dra_wire import PLUGINS_DIR
from hv_device_plugin.api.names import DEVICE_ACCESS_RESOURCE, HYPERVISOR_RESOURCE
from hv_device_plugin.cdi_spec import desired_spec, validate_spec
from hv_device_plugin.inputs import (
    Invalid,
    check_resource_name,
    parse_host_port,
    parse_https_url,
    parse_int,
    parse_seconds,
    show,
)
from hv_device_plugin.options import (
    ALLOWED_DEVICES,
    CDI_VERSIONS,
    DEFAULT_HEALTH_HOST,
    DEFAULT_PROBE_MAX_AGE_S,
    DEFAULTS,
    EXIT_CONFIG,
    LONGEST_SOCKET_NAME,
    MAX_CDI_FILENAME,
    MAX_ID,
    MAX_PROBE_AGE_S,
    MAX_REGISTER_ATTEMPTS,
    MAX_SLOTS,
    PROBE_MAX_AGE_S,
    PROBE_TIMEOUT_S,
    RECHECK_INTERVAL_S,
    REGISTER_ATTEMPT_TIMEOUT_S,
    REGISTER_BACKOFF_S,
    SUN_PATH_MAX,
    ConfigError,
    build_parser,
    env_name,
    flag_label,
)

# Importers use hv_device_plugin.config for the option facts as well as for parsing.
__all__ = [
    "ALLOWED_DEVICES",
    "CDI_VERSIONS",
    "DEFAULT_PROBE_MAX_AGE_S",
    "DEVICE_ACCESS_RESOURCE",
    "EXIT_CONFIG",
    "HYPERVISOR_RESOURCE",
    "MAX_PROBE_AGE_S",
    "MAX_SLOTS",
    "Config",
    "ConfigError",
    "env_name",
    "parse_config",
    "resolve_hypervisor_device",
]

T = TypeVar("T")


@dataclass(frozen=True)
class DraConfig:
    """--mode dra's own values (plugin.dra)."""

    driver_name: str
    node_name: str
    plugins_registry_dir: Path
    plugin_dir: Path
    api_server: str  # empty: in-cluster
    ca_file: str
    token_file: str
    client_cert: str
    client_key: str


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
    health_addr: tuple[str, int] | None
    register_attempts: int
    register_backoff_initial_s: float
    register_backoff_max_s: float
    register_attempt_timeout_s: float
    log_level: str
    # Flags whose value came from their HV_ variable: refusals name both.
    from_env: frozenset[str] = frozenset()
    dra: DraConfig | None = None  # --mode dra only

    @functools.cached_property
    def device_name(self) -> str:
        return Path(self.hypervisor_device).name

    @property
    def socket_prefix(self) -> str:
        return "hyperlight-access" if self.mode == "device-access" else "hyperlight"

    @property
    def host_view_path(self) -> Path | None:
        return None if self.host_dev_dir is None else self.host_dev_dir / self.device_name

    def cdi_spec(self) -> bytes:
        """The CDI spec this configuration owns (hypervisor mode): validated at parse time,
        written by the reconciler."""
        return desired_spec(
            kind_name=self.resource_name,
            device_name=self.device_name,
            device_path=self.hypervisor_device,
            uid=self.device_uid,
            gid=self.device_gid,
            cdi_version=self.cdi_version,
        )

    def label(self, flag: str) -> str:
        return flag_label(flag, self.from_env)


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
        raise Invalid(f"auto: no /dev/mshv or /dev/kvm under {root}")
    # Exact string comparison on purpose: no normalisation, so "dev/kvm", "/dev/kvm/../null"
    # or "/dev//kvm" can never be reinterpreted as an accepted path.
    if raw not in ALLOWED_DEVICES:
        raise Invalid(f"{show(raw)} refused: only /dev/kvm and /dev/mshv are accepted")
    try:
        st = os.lstat(raw)
    except FileNotFoundError:
        return raw  # may appear later; the device check reports it meanwhile
    if stat.S_ISLNK(st.st_mode):
        raise Invalid(f"{raw} refused: it is a symlink")
    if not stat.S_ISCHR(st.st_mode):
        raise Invalid(f"{raw} refused: it is not a character device")
    return raw


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in allowed:
            raise Invalid(f"{show(raw)} refused: use {', '.join(allowed)}")
        return raw

    return parse


_LOG_LEVELS = _choice("debug", "info", "warning", "error")


def _abs_path(raw: str) -> Path:
    if not raw.startswith("/"):
        raise Invalid(f"{show(raw)} must be an absolute path")
    if len(os.fsencode(raw)) > os.pathconf("/", "PC_PATH_MAX"):
        raise Invalid(f"{show(raw)} is longer than PATH_MAX")
    return Path(raw)


def _plugin_dir(raw: str) -> Path:
    path = _abs_path(raw)
    longest = len(os.fsencode(raw.rstrip("/"))) + LONGEST_SOCKET_NAME
    if longest > SUN_PATH_MAX:
        raise Invalid(
            f"{show(raw)} is too long for a unix socket path ({longest} > {SUN_PATH_MAX} bytes)"
        )
    return path


def _cdi_filename(raw: str) -> str:
    if (
        "/" in raw
        or raw.startswith(".")
        or not raw.endswith((".json", ".yaml"))
        or len(os.fsencode(raw)) > MAX_CDI_FILENAME
    ):
        raise Invalid(
            f"{show(raw)} must be a plain *.json or *.yaml name of at most {MAX_CDI_FILENAME} bytes"
        )
    return raw


def _health_addr(raw: str) -> tuple[str, int] | None:
    return parse_host_port(raw, DEFAULT_HEALTH_HOST) if raw else None


class _Values:
    """Raw values by flag, from argv, else the environment, else the default; remembers which."""

    def __init__(self, ns: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self._ns = ns
        self._environ = environ
        self._from_env: set[str] = set()

    @property
    def from_env(self) -> frozenset[str]:
        return frozenset(self._from_env)

    def _raw(self, flag: str) -> str:
        given = getattr(self._ns, flag.replace("-", "_"))
        if given is not None:
            return str(given)
        if env_name(flag) in self._environ:
            self._from_env.add(flag)
            return self._environ[env_name(flag)]
        return DEFAULTS[flag]

    def get(self, flag: str, parse: Callable[[str], T]) -> T:
        raw = self._raw(flag)
        try:
            if "\0" in raw:
                raise Invalid(f"{show(raw)} contains a NUL character")
            return parse(raw)
        except Invalid as exc:
            self.fail(flag, str(exc))

    def fail(self, flag: str, why: str) -> NoReturn:
        raise ConfigError(f"{flag_label(flag, self.from_env)}: {why}")


def _check_spec(cfg: Config, values: _Values) -> None:
    """The spec the plugin will write must be valid CDI: the resource name is its kind."""
    try:
        problems = validate_spec(cfg.cdi_spec())
    except ValueError as exc:
        problems = [str(exc)]
    if problems:
        values.fail("resource-name", f"not usable as a CDI kind: {problems[0]}")


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    values = _Values(build_parser().parse_args(list(argv)), env)
    mode = values.get("mode", _choice("hypervisor", "device-access", "dra"))
    host_dev_dir = values.get("host-dev-dir", lambda raw: _abs_path(raw) if raw else None)
    # In device-access mode the plugin has no device of its own: auto looks at the host view.
    host_view = host_dev_dir if mode == "device-access" else None
    device = values.get("hypervisor-device", lambda raw: resolve_hypervisor_device(raw, host_view))
    default_resource = DEVICE_ACCESS_RESOURCE if mode == "device-access" else HYPERVISOR_RESOURCE
    resource = values.get("resource-name", lambda raw: check_resource_name(raw or default_resource))
    slots = values.get("slots", lambda raw: parse_int(raw, 1, MAX_SLOTS))
    cfg = Config(
        mode=mode,
        hypervisor_device=device,
        resource_name=resource,
        slots=1 if mode == "device-access" else slots,
        device_plugin_dir=values.get("device-plugin-dir", _plugin_dir),
        cdi_dir=values.get("cdi-dir", _abs_path),
        cdi_version=values.get("cdi-version", _choice(*CDI_VERSIONS)),
        cdi_filename=values.get("cdi-filename", _cdi_filename),
        device_uid=values.get("device-uid", lambda raw: parse_int(raw, 0, MAX_ID)),
        device_gid=values.get("device-gid", lambda raw: parse_int(raw, 0, MAX_ID)),
        host_dev_dir=host_dev_dir,
        probe_timeout_s=values.get("probe-timeout", lambda r: parse_seconds(r, *PROBE_TIMEOUT_S)),
        probe_max_age_s=values.get("probe-max-age", lambda r: parse_seconds(r, *PROBE_MAX_AGE_S)),
        recheck_interval_s=values.get(
            "recheck-interval", lambda r: parse_seconds(r, *RECHECK_INTERVAL_S)
        ),
        health_addr=values.get("health-addr", _health_addr),
        register_attempts=values.get(
            "register-attempts", lambda raw: parse_int(raw, 1, MAX_REGISTER_ATTEMPTS)
        ),
        register_backoff_initial_s=values.get(
            "register-backoff-initial", lambda r: parse_seconds(r, *REGISTER_BACKOFF_S)
        ),
        register_backoff_max_s=values.get(
            "register-backoff-max", lambda r: parse_seconds(r, *REGISTER_BACKOFF_S)
        ),
        register_attempt_timeout_s=values.get(
            "register-attempt-timeout", lambda r: parse_seconds(r, *REGISTER_ATTEMPT_TIMEOUT_S)
        ),
        log_level=values.get("log-level", lambda r: _LOG_LEVELS(r.lower())),
        from_env=values.from_env,
    )
    if cfg.register_backoff_initial_s > cfg.register_backoff_max_s:
        values.fail(
            "register-backoff-initial",
            f"{cfg.register_backoff_initial_s:g} is above --register-backoff-max "
            f"{cfg.register_backoff_max_s:g}",
        )
    if mode in ("hypervisor", "dra"):
        _check_spec(cfg, values)
    if mode == "dra":
        cfg = dataclasses.replace(cfg, dra=_dra_config(values))
    return cfg


# A DRA driver name: a DNS subdomain of at most 63 characters (resource.k8s.io DriverNameMaxLength)
_DRIVER = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def _subdomain(limit: int) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if not raw or len(raw) > limit or not _DRIVER.fullmatch(raw):
            raise Invalid(f"{show(raw)} is not a DNS subdomain of at most {limit} characters")
        return raw

    return parse


def _https(raw: str) -> str:
    return parse_https_url(raw) if raw else ""  # empty: in-cluster


def _file_or_empty(raw: str) -> str:
    return str(_abs_path(raw)) if raw else ""


def _dra_config(values: _Values) -> DraConfig:
    driver = values.get("driver-name", _subdomain(63))
    server = values.get("kube-api-server", _https)
    dra = DraConfig(
        driver_name=driver,
        node_name=values.get("node-name", _subdomain(253)),
        plugins_registry_dir=values.get("plugins-registry-dir", _plugin_dir),
        plugin_dir=values.get(
            "dra-plugin-dir", lambda raw: _plugin_dir(raw or f"{PLUGINS_DIR}/{driver}")
        ),
        api_server=server,
        ca_file=values.get("kube-ca-file", _file_or_empty),
        token_file=values.get("kube-token-file", _file_or_empty),
        client_cert=values.get("kube-client-cert", _file_or_empty),
        client_key=values.get("kube-client-key", _file_or_empty),
    )
    if server and not dra.ca_file:
        values.fail("kube-ca-file", "required with --kube-api-server")
    if server and not (dra.token_file or dra.client_cert):
        values.fail("kube-api-server", "needs --kube-token-file or --kube-client-cert")
    if dra.client_key and not dra.client_cert:
        values.fail("kube-client-key", "needs --kube-client-cert")
    return dra
