"""--kube-api-server (and HV_KUBE_API_SERVER) by URL rules, refused in the configuration.

Each bad URL runs the real program (`python -m hv_device_plugin --mode dra`): exit 2, one stderr line
naming the flag, no traceback, nothing created. Before these rules a port of 99999, an unclosed
IPv6 bracket or a bare `https://` passed the configuration and crashed at start with a
traceback; credentials, a path and a query were silently dropped; CR and ESC were accepted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hv_device_plugin.config import ConfigError, parse_config
from hv_device_plugin.inputs import MAX_URL_CHARS

PLUGIN = [sys.executable, "-m", "hv_device_plugin"]
FLAG = "--kube-api-server"

BAD: dict[str, tuple[str, str]] = {  # name: (URL, a fragment of the one line)
    "port-99999": ("https://127.0.0.1:99999", "1-65535"),
    "port-0": ("https://127.0.0.1:0", "1-65535"),
    "port-letters": ("https://h:abc", "1-65535"),
    "port-empty": ("https://h:", "no port"),
    "port-signed": ("https://h:+443", "1-65535"),
    "ipv6-unclosed": ("https://[::1", "not an IPv6 address"),
    "ipv6-not-an-address": ("https://[::g]:443", "not an IPv6 address"),
    "ipv6-zone": ("https://[fe80::1%25eth0]:443", "not an IPv6 address"),
    "ipv6-unbracketed": ("https://::1:443", "brackets"),
    "ipv6-junk-after": ("https://[::1]x", "only :PORT"),
    "no-host": ("https://", "no host"),
    "no-host-port": ("https://:6443", "no host"),
    "bad-ipv4": ("https://256.1.1.1:6443", "neither an IP address"),
    "bad-label": ("https://-h.example:6443", "neither an IP address"),
    "cr": ("https://h.example\r", "control character"),
    "lf": ("https://h.example\n:6443", "control character"),
    "esc": ("https://h.example\x1b[31m", "control character"),
    "del": ("https://h.example\x7f", "control character"),
    "space": ("https://h.example :6443", "control character"),
    "non-ascii": ("https://h\u00e9.example", "non-ASCII"),
    "userinfo": ("https://admin:s3cret@h.example:6443", "credentials"),
    "user-only": ("https://admin@h.example", "credentials"),
    "query": ("https://h.example:6443?timeout=1s", "a query"),
    "query-after-slash": ("https://h.example/?x", "a query"),
    "fragment": ("https://h.example#top", "a fragment"),
    "path": ("https://h.example:6443/api", "a path"),
    "path-double-slash": ("https://h.example//", "a path"),
    "http": ("http://h.example", "https://"),
    "upper-scheme": ("HTTPS://h.example", "https://"),
    "no-scheme": ("h.example:6443", "https://"),
    "too-long": ("https://" + "a." * 200 + "example", f"{MAX_URL_CHARS} characters"),
}
GOOD = (
    "https://h.example",
    "https://h.example/",
    "https://h.example:6443",
    "https://api.cluster.local:443/",
    "https://127.0.0.1:1",
    "https://10.0.0.1:65535",
    "https://[::1]:6443",
    "https://[2001:db8::1]",
    "https://kubernetes",
    "https://H.Example:6443",
)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hvka-", dir="/tmp"))  # short: socket paths
    for sub in ("registry", "driver", "cdi", "dp"):
        (path / sub).mkdir()
    (path / "ca.crt").write_text("not read: the URL is refused first\n")
    (path / "token").write_text("t\n")
    yield path
    shutil.rmtree(path)


def _flags(root: Path) -> dict[str, str]:
    return {
        "mode": "dra",
        "node-name": "node-a",
        "plugins-registry-dir": str(root / "registry"),
        "dra-plugin-dir": str(root / "driver"),
        "device-plugin-dir": str(root / "dp"),
        "cdi-dir": str(root / "cdi"),
        "health-addr": "",
        "kube-ca-file": str(root / "ca.crt"),
        "kube-token-file": str(root / "token"),
    }


def _run(
    root: Path, flags: dict[str, str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HV_")}
    argv = [*PLUGIN, *(f"--{k}={v}" for k, v in flags.items())]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**clean, **env})


def _assert_one_line_refusal(proc: subprocess.CompletedProcess[str], says: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
    lines = proc.stderr.split("\n")
    assert lines[-1] == "" and len(lines) == 2, f"want exactly one line: {proc.stderr!r}"
    line = lines[0]
    assert line.startswith(f"hv-device-plugin: {FLAG}"), line
    assert line.isprintable() and "\r" not in line and "\x1b" not in line, repr(line)
    assert says in line, line
    return line


def _assert_nothing_created(root: Path) -> None:
    for sub in ("registry", "driver", "cdi", "dp"):
        assert list((root / sub).iterdir()) == [], f"{sub} was written"


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_url_is_one_line_exit_2_and_creates_nothing(root: Path, name: str) -> None:
    url, says = BAD[name]
    proc = _run(root, {**_flags(root), "kube-api-server": url}, {})
    line = _assert_one_line_refusal(proc, says)
    assert "s3cret" not in line, "a password in the URL is never echoed"
    _assert_nothing_created(root)


@pytest.mark.parametrize("name", ["port-99999", "esc", "userinfo", "path"])
def test_bad_url_from_the_environment_names_the_variable(root: Path, name: str) -> None:
    url, says = BAD[name]
    proc = _run(root, _flags(root), {"HV_KUBE_API_SERVER": url})
    line = _assert_one_line_refusal(proc, says)
    assert "(set by HV_KUBE_API_SERVER)" in line, line
    _assert_nothing_created(root)


@pytest.mark.parametrize("url", GOOD)
def test_good_url_is_accepted_by_the_configuration(root: Path, url: str) -> None:
    argv = [f"--{k}={v}" for k, v in _flags(root).items()] + [f"{FLAG}={url}"]
    cfg = parse_config(argv, {})
    assert cfg.dra is not None and cfg.dra.api_server == url


def test_good_url_passes_in_the_real_program(root: Path) -> None:
    """The real entry with a good URL and one later mistake: the refusal names the mistake, so
    the URL itself passed the configuration."""
    flags = {**_flags(root), "kube-api-server": "https://[::1]:6443/"}
    proc = _run(root, {**flags, "kube-client-key": str(root / "token")}, {})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == "hv-device-plugin: --kube-client-key: needs --kube-client-cert\n"
    _assert_nothing_created(root)


def test_empty_means_in_cluster(root: Path) -> None:
    cfg = parse_config([f"--{k}={v}" for k, v in _flags(root).items()] + [f"{FLAG}="], {})
    assert cfg.dra is not None and cfg.dra.api_server == ""


def test_every_bad_url_is_a_config_error_in_process(root: Path) -> None:
    """The same table through parse_config: a ConfigError each, never another exception."""
    base = [f"--{k}={v}" for k, v in _flags(root).items()]
    for name, (url, says) in BAD.items():
        with pytest.raises(ConfigError) as info:
            parse_config([*base, f"{FLAG}={url}"], {})
        assert says in str(info.value) and str(info.value).startswith(FLAG), name


def test_help_states_the_url_rules() -> None:
    out = subprocess.run([*PLUGIN, "--help"], capture_output=True, text=True, timeout=60).stdout
    flat = " ".join(out.split())
    assert "https://HOST[:PORT]" in flat and "no credentials, path, query or fragment" in flat
