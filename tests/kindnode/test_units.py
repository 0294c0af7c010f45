"""The kind node image's small parts, for real: runc-bounded rewriting a bundle and a process
spec before exec'ing a runtime, the OCI archive imported by a real containerd (the preload of
`nox -s kind-image`), the kind executable found in the cache, the recipe's cluster config."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvconform.targets.cluster import kindbin
from hvconform.targets.kindnode import oci, rootfs
from hvconform.targets.realnode.image import layer as pause_layer
from tests.scripts import python_script

ROOT = Path(__file__).resolve().parents[2]
RUNC_BOUNDED = ROOT / "scripts" / "runc-bounded"


def _bounding() -> set[int]:
    mask = next(
        int(line.split()[1], 16)
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("CapBnd:")
    )
    return {bit for bit in range(64) if mask >> bit & 1}


def _fake_runtime(tmp_path: Path) -> Path:
    """A runtime that records its argv and the spec files as runc would have read them."""
    return python_script(
        tmp_path / "runtime",
        "import json, sys, pathlib\n"
        f"out = pathlib.Path({str(tmp_path)!r}) / 'called.json'\n"
        "out.write_text(json.dumps(sys.argv[1:]))\n",
    )


ALL_CAPS = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_BPF", "CAP_NET_ADMIN"]


@pytest.mark.parametrize("command", ["create", "run"])
def test_runc_bounded_drops_caps_outside_the_bounding_set(tmp_path: Path, command: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    caps = {k: list(ALL_CAPS) for k in ("bounding", "effective", "permitted")}
    (bundle / "config.json").write_text(json.dumps({"process": {"capabilities": caps}}))
    env = dict(os.environ, HV_RUNC=str(_fake_runtime(tmp_path)))
    argv = [str(RUNC_BOUNDED), "--root", "/x", command, "--bundle", str(bundle), "ctr-id"]
    subprocess.run(argv, check=True, env=env, timeout=30)
    assert json.loads((tmp_path / "called.json").read_text()) == argv[1:], "argv passed as is"
    kept = json.loads((bundle / "config.json").read_text())["process"]["capabilities"]
    sys_resource_held = 24 in _bounding()
    for names in kept.values():
        assert ("CAP_SYS_RESOURCE" in names) == sys_resource_held
        assert "CAP_CHOWN" in names and "CAP_SYS_ADMIN" in names


def test_runc_bounded_rewrites_an_exec_process_and_leaves_other_commands(tmp_path: Path) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["cat"], "capabilities": {"bounding": ALL_CAPS}}))
    env = dict(os.environ, HV_RUNC=str(_fake_runtime(tmp_path)))
    subprocess.run([str(RUNC_BOUNDED), "exec", "--process", str(process), "id"], check=True,
                   env=env, timeout=30)  # fmt: skip
    names = json.loads(process.read_text())["capabilities"]["bounding"]
    assert ("CAP_SYS_RESOURCE" in names) == (24 in _bounding())
    untouched = tmp_path / "untouched.json"
    untouched.write_text(json.dumps({"capabilities": {"bounding": ALL_CAPS}}))
    before = untouched.read_bytes()
    subprocess.run([str(RUNC_BOUNDED), "state", str(untouched)], check=True, env=env, timeout=30)
    assert untouched.read_bytes() == before


@pytest.mark.root
def test_archive_of_binary_images_imports_into_a_real_containerd(tmp_path: Path) -> None:
    """What `nox -s kind-image` preloads: a several-image OCI tar, unpacked by containerd."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("containerd/ctr missing: `nox -s node-deps` installs them")
    binary = Path(sys.executable).resolve()
    images = [
        oci.Image("registry.test/one:v1", (oci.binary_layer(binary, "/usr/local/bin/one"),)),
        oci.Image("registry.test/pause:3", (pause_layer(b"#!/bin/true\n"),), ("/pause",)),
    ]
    archive = tmp_path / "images.tar"
    oci.write_archive(images, archive)
    first = archive.read_bytes()
    oci.write_archive(images, archive)
    assert archive.read_bytes() == first, "the same inputs give the same archive"
    root = tmp_path / "node"
    names = rootfs.preload(root, archive, lambda m: None)
    assert names == ["registry.test/one:v1", "registry.test/pause:3"]
    snapshots = root / "var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"
    unpacked = list(snapshots.glob("*/fs/usr/local/bin/one"))
    assert len(unpacked) == 1 and stat.S_IMODE(unpacked[0].stat().st_mode) == 0o755
    assert unpacked[0].read_bytes() == binary.read_bytes()


def test_kind_from_the_cache_when_none_is_on_path(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    cached = tmp_path / "gobin" / "kind"
    cached.parent.mkdir()
    cached.write_text("#!/bin/sh\necho 'kind v9.9.9 go1.26 linux/amd64'\n")
    cached.chmod(0o755)
    monkeypatch.setattr(kindbin, "KIND_BIN", cached)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert kindbin.kind_executable() == str(cached)
    env = kindbin.kind_env()
    assert env is not None and env["PATH"].split(":")[0] == str(cached.parent)
    facts = kindbin.kind_facts("hv-kind.local/node:v1.37.2")
    assert facts == {"kind": str(cached), "kind_version": "v9.9.9",
                     "node_image": "hv-kind.local/node:v1.37.2"}  # fmt: skip
    on_path = tmp_path / "bin"
    on_path.mkdir()
    shutil.copy(cached, on_path / "kind")
    monkeypatch.setenv("PATH", str(on_path))
    assert kindbin.kind_executable() == str(on_path / "kind") and kindbin.kind_env() is None
    cached.unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert kindbin.kind_executable() == "kind" and kindbin.main() == 2


def test_cluster_config_handles_cgroup_v1_and_keeps_the_plugin_needs() -> None:
    config = yaml.safe_load((ROOT / "kind" / "cluster.yaml").read_text())
    patches = [yaml.safe_load(p) for p in config["kubeadmConfigPatches"]]
    assert {"kind": "KubeletConfiguration", "failCgroupV1": False} in patches
    node = config["nodes"][0]
    assert {"hostPath": "/dev/kvm", "containerPath": "/dev/kvm"} in node["extraMounts"]
    assert "enable_cdi = true" in config["containerdConfigPatches"][0]
    # the image's own containerd config has CDI on for the same directories (any cluster config)
    toml = (ROOT / "kind" / "node" / "containerd.toml").read_text()
    assert 'cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]' in toml and "enable_cdi = true" in toml


def test_each_node_runtime_has_its_own_image_tag_and_containerd_config() -> None:
    from hvconform.targets.kindnode import NODE_IMAGE, NODE_RUNTIMES, RECIPE, node_image
    from hvconform.targets.realnode import CONTAINERD2_VERSION

    assert node_image() == node_image("containerd-1.7") == NODE_IMAGE
    assert node_image("containerd-2.3") == f"{NODE_IMAGE}-containerd-{CONTAINERD2_VERSION}"
    assert len({node_image(r) for r in NODE_RUNTIMES}) == len(NODE_RUNTIMES)
    with pytest.raises(ValueError, match=r"containerd-1\.7, containerd-2\.3"):
        node_image("cri-o")
    # each image's containerd reads its own config version, CDI on in the form it reads
    v2, v3 = (RECIPE / "containerd.toml").read_text(), (RECIPE / "containerd2.toml").read_text()
    assert "version = 2" in v2 and 'plugins."io.containerd.grpc.v1.cri"' in v2
    assert "version = 3" in v3 and "plugins.'io.containerd.cri.v1.runtime'" in v3
    assert "enable_cdi = true" in v2 and "enable_cdi = true" in v3
    assert set(rootfs.RUNTIME_PROGRAMS) == {"containerd", "containerd-shim-runc-v2", "runc"}
