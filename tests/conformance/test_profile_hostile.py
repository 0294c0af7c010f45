"""Careless and hostile plugin profiles (issue 27): each refused with one line, exit 2, nothing
written, no traceback, bounded time and memory, and no file content echoed beyond a short
escaped excerpt. The loader is the one `hvconform run --plugin-profile` and `bench --versus`
use; the CLI cases run the real `hvconform run` in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvconform.contract.plugin import ProfileError, load_profile, parse_profile

HVCONFORM = [sys.executable, "-m", "hvconform.cli"]
SETTINGS = settings(
    database=None,
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
BOMB = (
    'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "command: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
)


def run(profile: Path | str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    reports = tmp_path / "reports"
    return subprocess.run(
        [*HVCONFORM, "run", "--plugin-profile", str(profile), "--reports-root", str(reports)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def refused(proc: subprocess.CompletedProcess[str], tmp_path: Path) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr and len(proc.stderr) < 600, proc.stderr[:600]
    assert not (tmp_path / "reports").exists(), "a refused run wrote its reports dir"
    return lines[0]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    line = refused(run(fifo, tmp_path), tmp_path)
    assert "not a regular file" in line and time.monotonic() - t0 < 30


def test_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    assert "not a regular file" in refused(run("/dev/zero", tmp_path), tmp_path)


def test_an_alias_bomb_is_refused_in_bounded_time(tmp_path: Path) -> None:
    t0 = time.monotonic()
    line = refused(run(write(tmp_path, BOMB), tmp_path), tmp_path)
    assert "aliases are not allowed" in line and time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: 2001-13-45\ncommand: [x]\n", None),  # a string, not a date error
        ("command: [x]\nresource: 1" + "0" * 5000 + "\n", "more than 18 digits"),
        ("command: [x]\ncommand: [y]\n", "duplicate key 'command'"),
        ('command: [x]\n"bad\\n\\u001b[31mkey": 1\n', "unknown key 'bad\\n\\x1b[31mkey'"),
        ("command: [x]\npaths: {devicePluginDir: //dev}\n", "normalised absolute"),
        ("command: [x]\npaths: {hostDevDir: //dev}\n", "normalised absolute"),
        (
            "command: [x]\npaths: {cdiDir: /var/lib/kubelet/device-plugins/}\n",
            "normalised absolute",
        ),
        ("command: [x]\npaths: {cdiDir: /var/lib/kubelet/device-plugins/cdi}\n", "not nest"),
        ("command: [x]\npaths: {devicePluginDir: /proc}\n", "system tree"),
        ("command: [x]\npaths: {devicePluginDir: /etc/kubelet}\n", "system tree"),
        ('command: [x]\nenv: {"A=B": x}\n', "not an environment variable name"),
        ('command: [x]\nenv: {"A\\u0000B": x}\n', "not an environment variable name"),
        ('command: [x]\nenv: {A: "x\\u0000"}\n', "without NUL"),
        (
            "command: [x]\nreadiness: {type: http, url: 'http://10.0.0.1:80/readyz'}\n",
            "loopback",
        ),
        ("command: [x]\nresource: kubernetes.io/x\n", "extended resource name"),
        ("command: [x]\nresource: Example.com/x\n", "extended resource name"),
        ("command: [x]\nresource: example.com/" + "x" * 10000 + "\n", "longer than 4096"),
        # round three (found by the review of round two): a hex literal is no smaller, the
        # probe's host is the whole host, alias bombs anywhere
        ("command: [x]\nresource: 0x" + "f" * 6000 + "\n", "more than 18 digits"),
        ("command: [x]\nname: 0x" + "f" * 6000 + "\n", "more than 18 digits"),
        ("command: [x]\ndeploy: {image: 0x" + "f" * 6000 + "}\n", "more than 18 digits"),
        (
            "command: [x]\nreadiness: {type: http, url: 'http://{health_host}@10.0.0.1:80/r'}\n",
            "loopback",
        ),
        (
            "command: [x]\nreadiness: {type: http, url: 'http://{health_host}.example.com/r'}\n",
            "loopback",
        ),
        ("command: [x]\nreadiness: {type: http, url: 'http://127.0.0.1@10.0.0.1/r'}\n", "loopback"),
        ('a: &a ["x","x"]\nb: &b [*a,*a]\ncommand: [x]\nname: *b\n', "aliases are not allowed"),
        ('a: &a "http"\ncommand: [x]\nreadiness: {type: *a}\n', "aliases are not allowed"),
        ("command: [x]\nenv: {A: 1, A: 2}\n", "duplicate key 'A'"),
        ("root:$y$j9T$secret:19000:0:99999:7:::\n", "no 'command' key"),
    ],
)
def test_each_reproduction_is_refused_with_one_line(
    tmp_path: Path, text: str, needle: str | None
) -> None:
    if needle is None:  # accepted: it must load without a traceback
        assert load_profile(write(tmp_path, text)).name == "2001-13-45"
        return
    line = refused(run(write(tmp_path, text), tmp_path), tmp_path)
    assert needle in line, line


def test_the_bench_refuses_the_same_inputs_in_one_line(tmp_path: Path) -> None:
    """`bench --versus` reads profiles through the same loader; its own lines are escaped too
    (a command or a profile path with a newline and an escape)."""
    odd = tmp_path / "ok\n\x1b[31m.yaml"
    odd.write_text('command: ["/no\\nsuch\\u001b[31mplugin"]\n')
    for profile in (odd, write(tmp_path, "command: [x]\nresource: 0x" + "f" * 6000 + "\n")):
        proc = subprocess.run(
            [*HVCONFORM, "bench", "--versus", str(profile), "--out", str(tmp_path / "reports")],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        refused(proc, tmp_path)


def test_a_probe_redirect_is_not_followed(tmp_path: Path) -> None:
    """An http probe answered by a redirect reads as not healthy: the redirect could point off
    the plugin's own address."""
    import http.server
    import threading

    from hvconform.contract.plugin import Probe
    from hvconform.targets.local.observe import Observer

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "http://10.0.0.1/readyz")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        plugin = load_profile(write(tmp_path, "command: [x]\n"))
        probe = Probe("http", "http://{health_addr}/readyz")
        addr = f"127.0.0.1:{server.server_address[1]}"
        ready = Observer(plugin, probe, health_addr=lambda: addr, socket=lambda: None,
                         pid=lambda: 0)  # fmt: skip
        assert ready() is False
    finally:
        server.shutdown()
        server.server_close()


def test_a_symlink_to_a_secret_never_prints_it(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$VERYSECRETHASH:19000:0:99999:7:::\nalice:$y$x:1:::\n")
    link = tmp_path / "profile.yaml"
    link.symlink_to(secret)
    line = refused(run(link, tmp_path), tmp_path)
    assert "SECRET" not in line and "alice" not in line and "$y$" not in line


def test_a_path_with_a_newline_and_escape_is_quoted(tmp_path: Path) -> None:
    odd = tmp_path / "a\nb\x1b[31m.yaml"
    odd.write_text(BOMB)
    line = refused(run(odd, tmp_path), tmp_path)
    assert "\\n" in line and "\\x1b" in line


_keys = st.sampled_from(["name", "command", "env", "paths", "readiness", "liveness", "resource",
                         "cdi", "deploy", "devicePluginDir", "type", "url"])  # fmt: skip
_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=30)
)
_values = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(_keys, st.text(max_size=10)), inner, max_size=5),
    ),
    max_leaves=20,
)


@SETTINGS
@given(data=_values)
@example(data={"command": ["x"], "paths": {"devices": ["/dev/kvm", "/dev/kvm"]}})
@example(data={"command": ["x"], "deploy": {"image": "x:latest"}})
@example(data={"command": ["x"], "readiness": {"type": "http", "url": "http://[::1/"}})
def test_any_parsed_value_is_a_profile_or_one_line_error(tmp_path: Path, data: object) -> None:
    """The loader never raises anything but ProfileError, and its message is one short line."""
    try:
        parse_profile(data, "p.yaml", tmp_path)
    except ProfileError as exc:
        message = str(exc)
        assert "\n" not in message and "\x1b" not in message and len(message) < 600, message


@SETTINGS
@given(raw=st.binary(max_size=400))
def test_any_bytes_are_a_profile_or_one_line_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(raw)
    try:
        load_profile(path)
    except ProfileError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600, str(exc)


def test_a_group_lookup_that_is_a_secret_file_prints_none_of_it(tmp_path: Path) -> None:
    """`hvconform metadata check-startup --group-lookup /etc/shadow` printed root's line."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$VERYSECRETHASH:19000:0:99999:7:::\n")
    snap = tmp_path / "snap.json"
    subprocess.run([*HVCONFORM, "metadata", "snapshot", "--device", "/dev/kvm", "--out",
                    str(snap)], check=True, capture_output=True)  # fmt: skip
    proc = subprocess.run(
        [*HVCONFORM, "metadata", "check-startup", "--original", str(snap), "--current",
         str(snap), "--group-lookup", str(secret)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout
    assert "SECRET" not in proc.stderr + proc.stdout and "$y$" not in proc.stderr + proc.stdout


def test_a_cluster_dry_run_without_helm_is_environment_blocked(tmp_path: Path) -> None:
    """A fresh machine had a traceback ("helm not found"): now exit 6, one line, the fix."""
    proc = subprocess.run(
        [*HVCONFORM, "run", "--target", "kind", "--dry-run", "--reports-root", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "HV_HELM": str(tmp_path / "no-helm-here")},
    )  # fmt: skip
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "nox -s helm" in proc.stderr and not proc.stdout
