"""The checks of a parsed configuration against this machine, before anything is created.

Directories must exist, be directories (never followed through a symlink at their last
component) and be writable where the plugin writes; the health address must resolve and its
port is bound and listening here, so a port in use is a configuration error and no other
process can take it between this check and the server's start.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
import stat
from pathlib import Path

from hv_device_plugin.config import Config, ConfigError
from hv_device_plugin.device import a_file_type, describe_oserror
from hv_device_plugin.inputs import show

# What asyncio.start_server would use; connections made before the loop serves wait in it.
LISTEN_BACKLOG = 100


def check_directory(path: Path, label: str, *, writable: bool) -> None:
    """Refuse a missing path, a non-directory and a symlink, and an unusable directory."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise ConfigError(f"{label}: {show(str(path))} does not exist") from None
        raise ConfigError(f"{label}: {show(str(path))}: {describe_oserror(exc)}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{label}: {show(str(path))} is a symlink; refusing to follow it (give its target)"
        )
    if not stat.S_ISDIR(st.st_mode):
        kind = a_file_type(st.st_mode)
        raise ConfigError(f"{label}: {show(str(path))} is {kind}, not a directory")
    need = os.R_OK | os.X_OK | (os.W_OK if writable else 0)
    if not os.access(path, need):
        what = "writable" if writable else "readable"
        raise ConfigError(f"{label}: directory {show(str(path))} is not {what} by this process")


_FIELDS = {
    "kube-ca-file": "ca_file",
    "kube-token-file": "token_file",
    "kube-client-cert": "client_cert",
    "kube-client-key": "client_key",
}


def check_file(path: str, label: str) -> None:
    """A named credential file: a readable regular file (empty: not named, nothing to check)."""
    if not path:
        return
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{label}: {show(path)}: {describe_oserror(exc)}") from None
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.R_OK):
        raise ConfigError(f"{label}: {show(path)} is not a readable regular file")


def check_tls(cfg: Config) -> None:
    """The CA bundle and the client certificate load (a PEM that is not one is refused now,
    not at the first API call)."""
    dra = cfg.dra
    if dra is None or not dra.api_server:
        return
    try:
        context = ssl.create_default_context(cafile=dra.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{cfg.label('kube-ca-file')}: not a CA bundle ({exc})"[:300]) from None
    if dra.client_cert:
        try:
            context.load_cert_chain(dra.client_cert, dra.client_key or None)
        except (ssl.SSLError, OSError) as exc:
            label = cfg.label("kube-client-cert")
            raise ConfigError(f"{label}: not a certificate and key ({exc})"[:300]) from None


def bind_health(cfg: Config) -> socket.socket | None:
    """The health endpoints' listening socket, or None when --health-addr is empty."""
    if cfg.health_addr is None:
        return None
    host, port = cfg.health_addr
    label = cfg.label("health-addr")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{label}: host {show(host)} does not resolve ({why})") from None
    family, kind, proto, _, address = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As asyncio would: a restarted plugin must not wait for TIME_WAIT to pass. Linux still
        # refuses the bind while another socket listens on the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        where = f"{host}:{port}" if family != socket.AF_INET6 else f"[{host}]:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"{label}: {where} is already in use") from None
        raise ConfigError(f"{label}: cannot listen on {where}: {describe_oserror(exc)}") from None
    return sock


def preflight(cfg: Config) -> socket.socket | None:
    """Every check against the machine; returns the bound health socket (None if disabled)."""
    if cfg.dra is None:  # a DRA driver never touches the device plugin dir
        check_directory(cfg.device_plugin_dir, cfg.label("device-plugin-dir"), writable=True)
    else:
        check_directory(
            cfg.dra.plugins_registry_dir, cfg.label("plugins-registry-dir"), writable=True
        )
        check_directory(cfg.dra.plugin_dir, cfg.label("dra-plugin-dir"), writable=True)
        for flag in ("kube-ca-file", "kube-token-file", "kube-client-cert", "kube-client-key"):
            check_file(getattr(cfg.dra, _FIELDS[flag]), cfg.label(flag))
        check_tls(cfg)
    if cfg.mode in ("hypervisor", "dra"):
        check_directory(cfg.cdi_dir, cfg.label("cdi-dir"), writable=True)
    if cfg.host_dev_dir is not None:
        check_directory(cfg.host_dev_dir, cfg.label("host-dev-dir"), writable=False)
    return bind_health(cfg)  # last: nothing else can fail once the port is held
