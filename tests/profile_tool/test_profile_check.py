"""`hvconform profile check`: per target, what runs and how it is observed, or why it is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.profile_tool.test_profile_init import GO_KVM, ROOT, daemonset, hvconform


def sections(text: str) -> dict[str, str]:
    """The output split by target header ("local:", "local --runtime container:", ...)."""
    out: dict[str, str] = {}
    current = ""
    for line in text.splitlines()[1:]:
        if not line.startswith(" "):
            current = line.rstrip(":")
            out[current] = ""
        else:
            out[current] += line + "\n"
    return out


def test_go_kvm_profile_per_target(tmp_path: Path) -> None:
    done = hvconform("profile", "check", str(GO_KVM / "profile.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = sections(done.stdout)
    assert list(got) == [
        "local", "local --runtime container", "node", "cluster", "kind", "aks",
    ]  # fmt: skip
    assert "runs: '{profile_dir}/bin/go-kvm' -v=2" in got["local"]
    assert "grpc.health.v1 Check(service='liveness')" in got["local"]
    # manifests by target key: "local" for the container runtime, "*" for the clusters
    assert "deploy/daemonset.yaml" in got["local --runtime container"]
    for cluster in ("cluster", "kind", "aks"):
        assert "deploy/daemonset-cluster.yaml" in got[cluster], cluster
        assert "DaemonSet go-kvm, container go-kvm" in got[cluster]
        assert "the pod's Ready condition" in got[cluster]  # no HTTP health port in it
        assert "refused" not in got[cluster]


def test_a_profile_without_deploy_runs_only_as_a_process(tmp_path: Path) -> None:
    profile = ROOT / "fixtures" / "plugins" / "generic-device-plugin" / "profile.yaml"
    done = hvconform("profile", "check", str(profile), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = sections(done.stdout)
    assert "runs: " in got["local"] and "runs: " in got["node"]
    assert "/health" in got["local"]  # its liveness URL
    for target in ("local --runtime container", "cluster", "kind", "aks"):
        assert got[target].strip().startswith("refused: deploy:"), target


def test_manifests_only_for_local_leave_the_clusters_nothing(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(daemonset()))
    profile = tmp_path / "p.yaml"
    profile.write_text(
        'command: ["/bin/kvm-plugin"]\n'
        "resource: example.com/kvm\n"
        "deploy:\n"
        "  image: example.com/kvm-plugin:1.2.3\n"
        "  manifests: {local: [ds.json]}\n"
        "  pods: {labels: {app: kvm-plugin}, container: plugin}\n"
    )
    done = hvconform("profile", "check", "p.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = sections(done.stdout)
    assert f"objects (key 'local'): {tmp_path / 'ds.json'}" in got["local --runtime container"]
    assert (
        "runs: hvconform/kvm-plugin/plugin: '<image ENTRYPOINT>'"
        in got["local --runtime container"]
    )
    for cluster in ("cluster", "kind", "aks"):
        assert "refused: deploy.manifests: none for target" in got[cluster], got[cluster]


def test_an_unloadable_profile_is_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("- not\n- a mapping\n")
    done = hvconform("profile", "check", str(profile), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "want a mapping" in lines[0] and "Traceback" not in done.stderr


def test_a_reader_that_leaves_gets_no_traceback() -> None:
    """`hvconform profile check P | head -1`: the pipe closes under the writer (here before
    it writes at all, so the write always meets a closed pipe)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    argv = [
        sys.executable,
        "-m",
        "hvconform.cli",
        "profile",
        "check",
        str(GO_KVM / "profile.yaml"),
    ]
    try:
        done = subprocess.run(argv, stdout=write, capture_output=False, stderr=subprocess.PIPE,
                              timeout=120, check=False, cwd=ROOT)  # fmt: skip
    finally:
        os.close(write)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
