"""Careless and hostile configuration: exit 2, one line naming the flag (and the HV_ variable
when that set it), and nothing created: the CDI and socket directories stay empty.

Every input of issue 16's plugin section is a case; the real program runs each time.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hv_device_plugin.cdi import CdiReconciler
from hv_device_plugin.cdi_spec import desired_spec
from hv_device_plugin.config import MAX_SLOTS
from hv_device_plugin.version import COMMIT_ENV

PLUGIN = [sys.executable, "-m", "hv_device_plugin"]
DURATION_FLAGS = (
    "probe-timeout",
    "probe-max-age",
    "recheck-interval",
    "register-backoff-initial",
    "register-backoff-max",
    "register-attempt-timeout",
)


@dataclass(frozen=True)
class Case:
    """Flags (and HV_ variables) to set, the flag the one line must name, and a fragment of it.

    Values may name places made per test: {busy} a port in use, {file} a regular file,
    {missing} a path that does not exist, {link} a symlink to a directory.
    """

    flags: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    names: str = ""
    says: str = ""


CASES: dict[str, Case] = {
    "slots-1e9": Case({"slots": "1000000000"}, names="slots", says="above the maximum 10000"),
    "slots-max+1": Case({"slots": str(MAX_SLOTS + 1)}, names="slots", says="above the maximum"),
    "slots-0": Case({"slots": "0"}, names="slots", says="below the minimum 1"),
    "addr-no-port-separator": Case({"health-addr": "x"}, names="health-addr", says="HOST:PORT"),
    "addr-empty-port": Case({"health-addr": "127.0.0.1:"}, names="health-addr", says="no port"),
    "addr-port-99999": Case({"health-addr": ":99999"}, names="health-addr", says="0-65535"),
    "addr-port-negative": Case(
        {"health-addr": "127.0.0.1:-1"}, names="health-addr", says="0-65535"
    ),
    "addr-bad-ipv4": Case(
        {"health-addr": "256.1.1.1:8080"}, names="health-addr", says="neither an IP address"
    ),
    "addr-unresolvable": Case(
        {"health-addr": "no-such-host.invalid:8080"}, names="health-addr", says="does not resolve"
    ),
    "addr-in-use": Case({"health-addr": "{busy}"}, names="health-addr", says="already in use"),
    "plugin-dir-missing": Case(
        {"device-plugin-dir": "{missing}"}, names="device-plugin-dir", says="does not exist"
    ),
    "plugin-dir-regular-file": Case(
        {"device-plugin-dir": "{file}"}, names="device-plugin-dir", says="is a regular file"
    ),
    "plugin-dir-symlink": Case(
        {"device-plugin-dir": "{link}"}, names="device-plugin-dir", says="is a symlink"
    ),
    "cdi-dir-regular-file": Case({"cdi-dir": "{file}"}, names="cdi-dir", says="is a regular file"),
    "resource-name-slash": Case({"resource-name": "/"}, names="resource-name", says="'/'"),
    "resource-name-native": Case(
        {"resource-name": "kubernetes.io/kvm"}, names="resource-name", says="kubernetes.io"
    ),
    "resource-name-digit-vendor": Case(
        {"resource-name": "1vendor.dev/kvm"}, names="resource-name", says="CDI kind"
    ),
    "uid-huge": Case({"device-uid": "1" + "0" * 20}, names="device-uid", says="above the maximum"),
    "gid-uint32-max": Case({"device-gid": "4294967295"}, names="device-gid", says="above"),
    "backoff-initial-above-max": Case(
        {"register-backoff-initial": "10", "register-backoff-max": "5"},
        names="register-backoff-initial",
        says="above --register-backoff-max",
    ),
    "unknown-flag": Case({"no-such-flag": "1"}, says="unrecognized arguments"),
    "env-slots": Case(env={"HV_SLOTS": "1000000000"}, names="slots", says="HV_SLOTS"),
    "env-probe-timeout-nan": Case(
        env={"HV_PROBE_TIMEOUT": "nan"}, names="probe-timeout", says="HV_PROBE_TIMEOUT"
    ),
    "env-health-addr": Case(
        env={"HV_HEALTH_ADDR": "x"}, names="health-addr", says="HV_HEALTH_ADDR"
    ),
    "env-plugin-dir-symlink": Case(
        env={"HV_DEVICE_PLUGIN_DIR": "{link}"},
        names="device-plugin-dir",
        says="HV_DEVICE_PLUGIN_DIR",
    ),
    "env-cdi-dir-file": Case(env={"HV_CDI_DIR": "{file}"}, names="cdi-dir", says="HV_CDI_DIR"),
    "env-resource-name": Case(
        env={"HV_RESOURCE_NAME": "/"}, names="resource-name", says="HV_RESOURCE_NAME"
    ),
}
for _flag in DURATION_FLAGS:
    for _value, _says in (("nan", "finite"), ("inf", "finite"), ("1e308", "above the maximum")):
        CASES[f"{_flag}-{_value}"] = Case({_flag: _value}, names=_flag, says=_says)


@dataclass
class Place:
    root: Path
    cdi: Path
    sockets: Path
    link_target: Path
    busy: socket.socket


@pytest.fixture
def place() -> Iterator[Place]:
    # Short root on purpose: the socket path must fit in 107 bytes, or that refusal comes first.
    root = Path(tempfile.mkdtemp(prefix="hvc-", dir="/tmp"))
    cdi, sockets, target = root / "cdi", root / "dp", root / "target"
    for d in (cdi, sockets, target):
        d.mkdir()
    (root / "file").write_text("a regular file\n")
    (root / "link").symlink_to(target)
    try:
        with socket.create_server(("127.0.0.1", 0)) as busy:
            yield Place(root, cdi, sockets, target, busy)
    finally:
        shutil.rmtree(root)


def _fill(value: str, where: Place) -> str:
    return value.format(
        busy=f"127.0.0.1:{where.busy.getsockname()[1]}",
        file=where.root / "file",
        missing=where.root / "missing",
        link=where.root / "link",
    )


def _run(case: Case, where: Place) -> subprocess.CompletedProcess[str]:
    flags = {
        "cdi-dir": str(where.cdi),
        "device-plugin-dir": str(where.sockets),
        "health-addr": "127.0.0.1:0",
    }
    for name in case.env:  # the flag would win over the variable under test
        flags.pop(name.removeprefix("HV_").lower().replace("_", "-"), None)
    flags.update({k: _fill(v, where) for k, v in case.flags.items()})
    env = {k: v for k, v in os.environ.items() if not k.startswith("HV_")}
    env.update({k: _fill(v, where) for k, v in case.env.items()})
    argv = [*PLUGIN, *(f"--{k}={v}" for k, v in flags.items())]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_in_one_line_before_anything_is_created(name: str, place: Place) -> None:
    case = CASES[name]
    proc = _run(case, place)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("hv-device-plugin: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    line = lines[0]
    assert case.says in line, line
    if case.names:
        assert f"--{case.names}" in line, line
    for var in case.env:
        assert f"(set by {var})" in line, line
    # Nothing created: no spec, no socket, nothing through the symlink either.
    for d in (place.cdi, place.sockets, place.link_target):
        assert not list(d.iterdir()), f"{d} was written: {list(d.iterdir())}"


def test_version_names_the_package_version_and_source_commit() -> None:
    proc = subprocess.run([*PLUGIN, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    version = importlib.metadata.version("hv-device-plugin")
    head = subprocess.run(
        ["git", "-C", str(Path(__file__).parents[2]), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert proc.stdout == f"hv-device-plugin {version} (source commit {head})\n"


@pytest.mark.parametrize(
    ("baked", "shown"), [("0123abcd" * 5, "0123abcd" * 5), ("$(x)", "unknown")]
)
def test_version_takes_the_commit_baked_into_the_image(baked: str, shown: str) -> None:
    env = {**os.environ, COMMIT_ENV: baked}
    proc = subprocess.run(
        [*PLUGIN, "--version"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0 and proc.stdout.endswith(f"(source commit {shown})\n")


def test_help_states_the_bounds() -> None:
    out = subprocess.run([*PLUGIN, "--help"], capture_output=True, text=True, timeout=60).stdout
    flat = " ".join(out.split())
    assert f"1 to {MAX_SLOTS}" in flat and "--max-pods" in flat
    assert "Exit codes" in flat and "HV_HEALTH_ADDR" in flat


def test_the_chart_allows_no_more_slots_than_the_plugin() -> None:
    """A chart value the plugin would refuse must fail at `helm install`, not on the node."""
    schema = json.loads(
        (Path(__file__).parents[2] / "charts/hv-device-plugin/values.schema.json").read_text()
    )
    assert schema["properties"]["slots"]["maximum"] == MAX_SLOTS


def test_cdi_dir_turned_into_a_regular_file_is_named_so(tmp_path: Path) -> None:
    """After start-up the same words: a regular file, not 'an unknown file type'."""
    (tmp_path / "cdi").write_text("not a directory\n")
    desired = desired_spec(device_name="kvm", device_path="/dev/kvm")
    status = CdiReconciler(tmp_path / "cdi", "hyperlight.json", desired).reconcile()
    assert status.state == "error" and "is a regular file" in status.reason, status
