"""Only the run's own host paths (issue 34): a DRA driver's plugin dir is its own dir below the
kubelet's plugins dir, checked when the profile loads; at teardown the node target removes a
directory only when its ledger says the run made it, and from a directory that existed before
only what appeared in it during the run; `dra.deviceClass` is read as a regular file, bounded,
strict YAML, and must be a DeviceClass, each refusal one line, promptly. node-up takes a root
(/var/lib/kubelet) only when it made it. Real directories, files, sockets and mounts in
temporary dirs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hv_device_plugin.api.dra_wire import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from hvconform.contract.ledger import Ledger, read_entries, survivors
from hvconform.contract.plugin import ProfileError, load_profile
from hvconform.contract.results import EnvironmentBlocked
from hvconform.targets.realnode import stack
from hvconform.targets.realnode.dra_node import RealDraNode

DRIVER = "d.example.com"
CLASS = """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: d.example.com}
spec:
  selectors: [{cel: {expression: 'device.driver == "d.example.com"'}}]
  extendedResourceName: example.com/hv
"""


def _profile(tmp_path: Path, dra: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f'name: d\ncommand: ["/bin/driver"]\ndra: {dra}\n')
    return path


def _dra(**extra: str) -> str:
    fields = {"driver": DRIVER, "extendedResource": "example.com/hv", **extra}
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in fields.items()) + "}"


def _one_line(tmp_path: Path, dra: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(ProfileError) as err:
        load_profile(_profile(tmp_path, dra))
    said = str(err.value)
    assert "\n" not in said and len(said) < 400 and time.monotonic() - t0 < 5, said
    return said


# -- dra.pluginDir at load -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plugin_dir", "said"),
    [
        (PLUGINS_DIR, "want the driver's own dir strictly below /var/lib/kubelet/plugins"),
        ("/var/lib/kubelet", "want the driver's own dir strictly below"),
        ("/var/lib/other/plugins/d", "want the driver's own dir strictly below"),
        ("/var/lib/kubelet/pluginsx/d", "want the driver's own dir strictly below"),
        ("/var/lib/kubelet/plugins/../plugins", "normalised absolute directory"),
        (f"{PLUGINS_REGISTRY_DIR}/d", "must not be the registration dir or inside it"),
    ],
)
def test_a_plugin_dir_not_the_drivers_own_is_refused_at_load(
    tmp_path: Path, plugin_dir: str, said: str
) -> None:
    line = _one_line(tmp_path, _dra(pluginDir=plugin_dir))
    assert said in line and "dra.pluginDir" in line, line


def test_a_plugin_dir_holding_the_registration_dir_is_refused(tmp_path: Path) -> None:
    line = _one_line(tmp_path, _dra(pluginDir=f"{PLUGINS_DIR}/d",
                                    registrationDir=f"{PLUGINS_DIR}/d/registry"))  # fmt: skip
    assert "must not hold the registration dir" in line


@pytest.mark.parametrize("plugin_dir", [f"{PLUGINS_DIR}/{DRIVER}", f"{PLUGINS_DIR}/vendor/d"])
def test_the_drivers_own_dir_below_the_plugins_dir_is_accepted(
    tmp_path: Path, plugin_dir: str
) -> None:
    plugin = load_profile(_profile(tmp_path, _dra(pluginDir=plugin_dir)))
    assert plugin.dra is not None and plugin.dra.endpoint_dir == plugin_dir
    default = load_profile(_profile(tmp_path, _dra()))
    assert default.dra is not None and default.dra.endpoint_dir == f"{PLUGINS_DIR}/{DRIVER}"


# -- dra.deviceClass at load -------------------------------------------------------------------


def test_a_device_class_manifest_is_accepted_and_relative_to_the_profile(tmp_path: Path) -> None:
    (tmp_path / "class.yaml").write_text(CLASS)
    plugin = load_profile(_profile(tmp_path, _dra(deviceClass="class.yaml")))
    assert plugin.dra is not None and plugin.dra.device_class == str(tmp_path / "class.yaml")


def _class_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"class-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "real.yaml").write_text(CLASS)
        path.symlink_to(tmp_path / "real.yaml")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(
            {
                "list": "- apiVersion: resource.k8s.io/v1\n- kind: DeviceClass\n",
                "scalar": "just text\n",
                "duplicate": CLASS + "kind: DeviceClass\n",
                "two documents": CLASS + "---\n" + CLASS,
                "alias": "a: &a [1]\nb: *a\n",
                "binary": "\udcff\udcfe",
                "pod": CLASS.replace("kind: DeviceClass", "kind: Pod"),
                "core api": CLASS.replace("resource.k8s.io/v1", "v1"),
                "no metadata": CLASS.replace("metadata: {name: d.example.com}", "metadata: 3"),
                "bad name": CLASS.replace("{name: d.example.com}", "{name: Bad_Name}"),
                "spec a list": CLASS.split("spec:")[0] + "spec: [1]\n",
                "other resource": CLASS.replace("example.com/hv", "example.com/other"),
                "too large": CLASS + "#" * (80 * 1024) + "\n",
            }[kind],
            errors="surrogateescape",
        )
    return path


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("directory", "is not a regular file"),
        ("symlink", "is a symbolic link"),
        ("list", "want one DeviceClass manifest (a mapping), got list"),
        ("scalar", "want one DeviceClass manifest (a mapping), got str"),
        ("duplicate", "duplicate key 'kind'"),
        ("two documents", "not YAML"),
        ("alias", "alias"),
        ("binary", "not UTF-8"),
        ("pod", ".kind: want DeviceClass, got 'Pod'"),
        ("core api", ".apiVersion: want resource.k8s.io/<version>, got 'v1'"),
        ("no metadata", ".metadata: want a mapping"),
        ("bad name", ".metadata.name: want a DNS subdomain"),
        ("spec a list", ".spec: want a mapping"),
        ("other resource", ".spec.extendedResourceName: want 'example.com/hv'"),
        ("too large", "larger than 65536 bytes"),
    ],
)
def test_a_device_class_that_is_not_one_is_refused_in_one_line(
    tmp_path: Path, kind: str, said: str
) -> None:
    line = _one_line(tmp_path, _dra(deviceClass=str(_class_file(tmp_path, kind))))
    assert said in line and "dra.deviceClass" in line, line
    assert "device.driver" not in line, "the file's content is never echoed"


def test_dev_zero_as_device_class_is_refused_without_reading_it(tmp_path: Path) -> None:
    line = _one_line(tmp_path, _dra(deviceClass="/dev/zero"))
    assert "'/dev/zero' is not a regular file" in line


def test_a_fifo_as_device_class_is_refused_at_once_by_the_cli(tmp_path: Path) -> None:
    """Opened without blocking: a FIFO nobody writes never hangs the load (a subprocess, so a
    hang would fail here on the timeout instead of hanging the tests)."""
    fifo = _class_file(tmp_path, "fifo")
    profile = _profile(tmp_path, _dra(deviceClass=str(fifo)))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--target", "node",
         "--plugin-profile", str(profile), "--reports-root", str(tmp_path / "reports")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not a regular file" in lines[0] and "dra.deviceClass" in lines[0]
    assert time.monotonic() - t0 < 30 and not (tmp_path / "reports").exists()


# -- teardown: only what the run made --------------------------------------------------------


@pytest.fixture
def base() -> Iterator[Path]:
    """A short base dir: a unix socket's path is limited to 107 bytes (xdist's tmp_path is long)."""
    made = Path(tempfile.mkdtemp(prefix="hvhp-"))
    yield made
    shutil.rmtree(made)


@pytest.fixture
def plugins(base: Path) -> Path:
    """A kubelet's plugins dir with another driver's dir, socket and file, made before the run."""
    root = base / "kubelet" / "plugins"
    other = root / "other.example.com"
    other.mkdir(parents=True)
    (other / "notes").write_text("the other driver's")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(other / "dra.sock"))
    return root


def _state(root: Path) -> dict[str, tuple[int, int, float, bytes]]:
    """Everything below `root`: each entry's type, mode, inode and content, a file's mtime too
    (a directory's mtime moves when something is made in it and removed again)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        mtime = 0.0 if path.is_dir() and not path.is_symlink() else st.st_mtime
        out[str(path.relative_to(root))] = (st.st_mode, st.st_ino, mtime, data)
    return out


def _node(tmp_path: Path, endpoint: Path, registry: Path) -> RealDraNode:
    node = RealDraNode.__new__(RealDraNode)
    node.ledger = Ledger(tmp_path / "ledger" / "gw0.jsonl", owner="gw0")
    node._registry = registry
    node._endpoint_dir = endpoint
    node._endpoint_before = None
    return node


def _driver_runs(endpoint: Path) -> None:
    """What a driver makes in its plugin dir while it runs: its socket and a dir of its own."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(endpoint / "dra.sock"))
    (endpoint / "claims").mkdir()
    (endpoint / "claims" / "c1.json").write_text("{}")


def test_the_runs_own_plugin_dir_goes_and_the_plugins_dir_stays_as_it_was(
    base: Path, plugins: Path
) -> None:
    before = _state(plugins)
    endpoint = plugins / DRIVER
    node = _node(base, endpoint, plugins.parent / "plugins_registry")
    node._prepare_dirs()
    made = {e.ident for e in read_entries([node.ledger.path]) if e.kind == "dir"}
    assert made == {str(endpoint), str(plugins.parent / "plugins_registry")}
    _driver_runs(endpoint)
    assert node._release_dirs() == []
    assert not endpoint.exists() and not (plugins.parent / "plugins_registry").exists()
    assert _state(plugins) == before, "another driver's dir, socket or file changed"
    assert survivors(read_entries([node.ledger.path])) == []


def test_a_plugin_dir_that_existed_keeps_what_it_held(base: Path, plugins: Path) -> None:
    endpoint = plugins / DRIVER
    endpoint.mkdir()
    (endpoint / "left-by-someone").write_text("kept")
    (endpoint / "dra.sock.old").symlink_to("/nonexistent")
    registry = base / "kubelet" / "plugins_registry"
    registry.mkdir()
    before = _state(plugins)
    node = _node(base, endpoint, registry)
    node._prepare_dirs()
    assert read_entries([node.ledger.path]) == [], "nothing made: nothing recorded"
    _driver_runs(endpoint)
    assert node._release_dirs() == []
    assert _state(plugins) == before
    assert registry.is_dir()


def test_parents_the_run_made_go_only_while_empty(base: Path) -> None:
    plugins = base / "kubelet" / "plugins"  # the kubelet's dirs do not exist yet
    endpoint = plugins / DRIVER
    node = _node(base, endpoint, base / "kubelet" / "plugins_registry")
    node._prepare_dirs()
    made = [e.ident for e in read_entries([node.ledger.path])]
    assert made == [str(base / "kubelet"), str(base / "kubelet" / "plugins_registry"),
                    str(plugins), str(endpoint)]  # fmt: skip
    _driver_runs(endpoint)
    (plugins / "other.example.com").mkdir()  # another driver arrived meanwhile
    assert node._release_dirs() == []
    assert not endpoint.exists() and (plugins / "other.example.com").is_dir()
    assert not (base / "kubelet" / "plugins_registry").exists()


@pytest.fixture
def tmpfs(base: Path) -> Iterator[list[Path]]:
    mounted: list[Path] = []
    yield mounted
    for point in reversed(mounted):
        subprocess.run(["umount", str(point)], check=True)


def test_never_through_a_mount(base: Path, plugins: Path, tmpfs: list[Path]) -> None:
    endpoint = plugins / DRIVER
    node = _node(base, endpoint, plugins.parent / "plugins_registry")
    node._prepare_dirs()
    inside = endpoint / "mnt"
    inside.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "hv-test", str(inside)], check=True)
    tmpfs.append(inside)
    (inside / "on-the-mount").write_text("not removed through the mount")
    left = node._release_dirs()
    assert left == [f"dir {endpoint}: a mount inside ({inside})"]
    assert (inside / "on-the-mount").exists()


def test_a_plugin_dir_that_is_a_file_blocks_the_run(base: Path, plugins: Path) -> None:
    endpoint = plugins / DRIVER
    endpoint.write_text("not a dir")
    node = _node(base, endpoint, plugins.parent / "plugins_registry")
    with pytest.raises(EnvironmentBlocked, match="exists and is not a directory"):
        node._prepare_dirs()
    assert endpoint.read_text() == "not a dir"


# -- node-up's roots ----------------------------------------------------------------------------


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    run, state, kubelet = tmp_path / "run", tmp_path / "state", tmp_path / "kubelet"
    monkeypatch.setattr(stack, "RUN", run)
    monkeypatch.setattr(stack, "ROOTS", (run, state, kubelet))
    return run, state, kubelet


def test_node_up_refuses_a_kubelet_root_it_did_not_make(roots: tuple[Path, Path, Path]) -> None:
    run, state, kubelet = roots
    (kubelet / "pods").mkdir(parents=True)
    (kubelet / "pods" / "a-pod").write_text("someone else's kubelet")
    assert stack.own_roots() == ()
    why = stack.roots_refused()
    assert why.startswith(f"{kubelet} exists and node-up did not make it") and "\n" not in why
    with pytest.raises(RuntimeError, match="node-up did not make it"):
        stack._make_roots()
    assert not run.exists() and not state.exists(), "nothing made after a refusal"
    assert sorted(p.name for p in kubelet.rglob("*")) == ["a-pod", "pods"]


def test_node_up_marks_its_roots_and_only_those_are_its_own(
    roots: tuple[Path, Path, Path],
) -> None:
    run, state, kubelet = roots
    stack._make_roots()
    assert stack.own_roots() == roots and stack.roots_refused() == ""
    (kubelet / stack.ROOT_MARK).unlink()  # as a kubelet root that was there before would be
    assert stack.own_roots() == (run, state)


def test_a_stack_from_before_the_marks_is_its_own(roots: tuple[Path, Path, Path]) -> None:
    run, _, kubelet = roots
    run.mkdir()
    (run / "log-dirs-made").write_text("\n")  # what every node-up wrote
    kubelet.mkdir()
    assert stack.own_roots() == roots and stack.roots_refused() == ""
