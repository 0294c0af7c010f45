"""Image references, one definition (hvconform.contract.imageref) checked where each enters.

The grammar is distribution/reference's; the table holds what it accepts and what it refuses,
also through the places that delegate to it (a profile's deploy.image, the chart values, the
cluster options). The command line runs for real (`python -m hvconform.cli`): a bad --image or
--guest-image, on the container runtime and on a cluster dry run, is exit 2 and one line before
anything runs (before this, `--image $'bad\\nimage:1'` on `--runtime container` ran for 101 s,
built images and ended in a traceback; a newline in --guest-image faked plan lines).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvconform.contract import imageref
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.deploy import image_problem
from hvconform.contract.imageref import ImageRef, ImageRefError
from hvconform.contract.plugin import ProfileError, load_profile
from hvconform.manifests.render import ManifestError, check_image, image_values

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = ROOT / "fixtures" / "plans" / "kubeconfig.yaml"
SHA256 = "sha256:" + "a" * 64
HUGE = "a" * 10_000 + ":1"

# reference: its parts (domain, path, tag, digest)
VALID: dict[str, tuple[str, str, str, str]] = {
    "hv-device-plugin:0.1.0": ("", "hv-device-plugin", "0.1.0", ""),
    "library/busybox:1.36": ("", "library/busybox", "1.36", ""),
    "docker.io/library/busybox:1.36": ("docker.io", "library/busybox", "1.36", ""),
    "localhost/x:1": ("localhost", "x", "1", ""),
    "localhost:5000/hv/plugin:v1.2.3-rc.1": ("localhost:5000", "hv/plugin", "v1.2.3-rc.1", ""),
    "myacr.azurecr.io/hyperlight/hv-device-plugin:1.0": (
        "myacr.azurecr.io",
        "hyperlight/hv-device-plugin",
        "1.0",
        "",
    ),
    "Registry.Example.COM/a:1": ("Registry.Example.COM", "a", "1", ""),
    "Upper/case:1": ("Upper", "case", "1", ""),  # a capital makes the first part a registry
    "10.0.0.1:5000/a:1": ("10.0.0.1:5000", "a", "1", ""),
    "[::1]:5000/a:1": ("[::1]:5000", "a", "1", ""),
    "[2001:db8::1]/team/a:1": ("[2001:db8::1]", "team/a", "1", ""),
    "a__b.c-d---e_f:T_1.x-y": ("", "a__b.c-d---e_f", "T_1.x-y", ""),
    "a:" + "t" * 128: ("", "a", "t" * 128, ""),
    "a@" + SHA256: ("", "a", "", SHA256),
    "ghcr.io/org/a:1.0@" + SHA256: ("ghcr.io", "org/a", "1.0", SHA256),
    "a@sha512:" + "0" * 128: ("", "a", "", "sha512:" + "0" * 128),
    "a:latest": ("", "a", "latest", ""),  # a reference, only not pinned
    "a": ("", "a", "", ""),
    "x" * 255 + ":1": ("", "x" * 255, "1", ""),
}
# reference: a fragment of the refusal
INVALID: dict[str, str] = {
    "": "empty",
    "bad\nimage:1": "control character",
    "hv:1\n## cleanup: nothing will be deleted": "control character",
    "a:1\r": "control character",
    "a\x1b[31m:1": "control character",
    "a:1\x7f": "control character",
    "a b:1": "space",
    "caf\u00e9:1": "non-ASCII",
    HUGE: "longer than any reference",
    "x" * 256 + ":1": "more than 255",
    "example.com/" + "x" * 244 + ":1": "more than 255",
    "example.com/Upper:1": "path component 'Upper'",
    "Upper:1": "path component 'Upper'",
    "a//b:1": "path component ''",
    "a/:1": "path component ''",
    "/a:1": "path component ''",
    "a-:1": "path component 'a-'",
    "a..b:1": "path component 'a..b'",
    "a___b:1": "path component 'a___b'",
    "a:": "tag ''",
    "a:.1": "tag '.1'",
    "a:-1": "tag '-1'",
    "a:" + "t" * 129: "tag",
    "a:1:2": "path component 'a:1'",
    "a@sha256:" + "a" * 63: "64 lowercase hex",
    "a@sha256:" + "a" * 65: "64 lowercase hex",
    "a@sha256:" + "A" * 64: "64 lowercase hex",
    "a@sha256:" + "g" * 64: "64 lowercase hex",
    "a@md5:" + "a" * 32: "not one of sha256",
    "a@sha256": "algorithm:hex",
    "a@": "algorithm:hex",
    "a@" + SHA256 + "@" + SHA256: "64 lowercase hex",
    "[::1/a:1": "IPv6",
    "[::g]/a:1": "IPv6",
    "[fe80::1%eth0]/a:1": "IPv6",
    "[::ffff:1.2.3.4]/a:1": "IPv6",
    "::1/a:1": "registry host",
    "-bad.example/a:1": "registry host",
    "bad-.example/a:1": "registry host",
    "a" * 64 + ".example/b:1": "registry host",
    "256.1.1.1/a:1": "not an IPv4 address",
    "example.com:0/a:1": "port must be a number in 1-65535",
    "example.com:65536/a:1": "port must be a number in 1-65535",
    "example.com:abc/a:1": "port must be a number in 1-65535",
    "example.com:/a:1": "port must be a number in 1-65535",
    "example.com:1:2/a:1": "port must be a number in 1-65535",
}


def hvconform(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HV_")}
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", *args],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_refusal(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.split("\n")
    assert len(lines) == 2 and lines[1] == "", f"want exactly one line: {proc.stderr!r}"
    line = lines[0]
    assert line.isprintable() and "\x1b" not in line, repr(line)
    assert len(line) <= 400, f"unbounded: {len(line)} characters"
    for needle in needles:
        assert needle in line, line
    return line


@pytest.mark.parametrize("ref", sorted(VALID))
def test_valid_references_parse_into_their_parts(ref: str) -> None:
    parsed = imageref.parse(ref)
    assert (parsed.domain, parsed.path, parsed.tag, parsed.digest) == VALID[ref]
    assert str(parsed) == ref
    assert parsed.name == (f"{parsed.domain}/{parsed.path}" if parsed.domain else parsed.path)


@pytest.mark.parametrize("ref", sorted(INVALID))
def test_invalid_references_are_refused_in_one_bounded_line(ref: str) -> None:
    with pytest.raises(ImageRefError) as info:
        imageref.parse(ref)
    message = str(info.value)
    assert INVALID[ref] in message, message
    assert "is not an image reference" in message
    assert message.isprintable() and len(message) <= 400, repr(message)
    assert imageref.problem(ref) == message
    # every place that names an image refuses it through the one definition
    assert image_problem(ref) == message
    with pytest.raises(ManifestError, match="is not an image reference"):
        check_image(ref)
    with pytest.raises(ValueError, match=r"^--image .*is not an image reference"):
        ClusterOptions(image=ref).validate()


@pytest.mark.parametrize(
    ("ref", "pinned"),
    [
        ("a:1", True),
        ("a:latest", False),
        ("a:LATEST", False),
        ("a:Latest", False),
        ("a", False),
        ("example.com:5000/a", False),
        ("a@" + SHA256, True),
        ("a:latest@" + SHA256, False),  # the chart's schema never takes latest
        ("a:latest1", True),
    ],
)
def test_pinned_means_a_tag_other_than_latest_or_a_digest(ref: str, pinned: bool) -> None:
    assert imageref.parse(ref).pinned is pinned
    assert (imageref.problem(ref, pinned=True) is None) is pinned
    assert (image_problem(ref) is None) is pinned
    if not pinned:
        message = imageref.problem(ref, pinned=True)
        assert message is not None and "is not pinned" in message and "digest" in message
        assert "explicit tag" in message and "':latest'" in message
        with pytest.raises(ManifestError, match="is not pinned"):
            check_image(ref)


def test_image_values_are_the_parsed_parts() -> None:
    ref = "localhost:5000/hv/plugin:1.0@" + SHA256
    assert image_values(ref) == {
        "repository": "localhost:5000/hv/plugin",
        "tag": "1.0",
        "digest": SHA256,
    }
    assert image_values("[::1]:5000/p@" + SHA256)["repository"] == "[::1]:5000/p"
    with pytest.raises(ManifestError, match="not pinned"):
        image_values("hv:latest")


def test_the_parts_are_typed() -> None:
    parsed = imageref.parse("ghcr.io/o/a:1")
    assert isinstance(parsed, ImageRef) and parsed == ImageRef("ghcr.io", "o/a", "1", "")


def test_a_shown_reference_is_bounded_and_escaped() -> None:
    message = imageref.problem(HUGE) or ""
    assert len(message) < 300 and "(10002 characters)" in message
    message = imageref.problem("a\x1b]0;title\x07:1") or ""
    assert "\\x1b" in message and "\x1b" not in message and "\x07" not in message


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("guest_image", "bad\nimage:1", "--guest-image"),
        ("guest_image", "hv-guest:latest", "--guest-image"),
        ("node_image", "kindest/node:v1\n", "--node-image"),
        ("diag_image", "Busy Box:1", "--diag-image"),
    ],
)
def test_cluster_options_check_every_image(field: str, value: str, flag: str) -> None:
    with pytest.raises(ValueError, match=f"^{flag} "):
        ClusterOptions(**{field: value}).validate()  # type: ignore[arg-type]


def test_cluster_options_accept_an_unpinned_node_or_diag_image() -> None:
    ClusterOptions(node_image="kindest/node", diag_image="busybox").validate()


def test_a_profiles_deploy_image_is_checked(tmp_path: Path) -> None:
    (tmp_path / "ds.yaml").write_text("{}\n")
    profile = tmp_path / "p.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "p",
                "command": ["/bin/true"],
                "deploy": {
                    "image": "bad\nimage:1",
                    "manifests": ["ds.yaml"],
                    "pods": {"labels": {"app": "p"}, "container": "plugin"},
                },
            }
        )
    )
    with pytest.raises(ProfileError, match=r"deploy\.image: 'bad\\nimage:1' is not an image"):
        load_profile(profile)


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--runtime", "container", "--image", "bad\nimage:1"], "--image"),
        (["--runtime", "container", "--image", HUGE], "--image"),
        (["--runtime", "container", "--image", "hv-device-plugin:latest"], "--image"),
        (["--runtime", "container", "--guest-image", "bad\nimage:1"], "--guest-image"),
        (
            ["--target", "cluster", "--dry-run", "--kubeconfig", str(KUBECONFIG),
             "--node", "n1", "--image", "bad\nimage:1"],
            "--image",
        ),
        (
            ["--target", "cluster", "--dry-run", "--kubeconfig", str(KUBECONFIG),
             "--node", "n1", "--guest-image", "hv-guest:1\n## cleanup: nothing will be deleted"],
            "--guest-image",
        ),
        (
            ["--target", "cluster", "--dry-run", "--kubeconfig", str(KUBECONFIG),
             "--node", "n1", "--diag-image", "busybox:1\x1b[2J"],
            "--diag-image",
        ),
        (["--target", "kind", "--dry-run", "--node-image", "kindest/node:v1\r"], "--node-image"),
        (["--target", "kind", "--dry-run", "--image", "Hv:1"], "--image"),
    ],
)  # fmt: skip
def test_a_bad_image_flag_is_one_line_before_anything_runs(
    tmp_path: Path, args: list[str], flag: str
) -> None:
    out = tmp_path / "out"
    reports = tmp_path / "reports"
    proc = hvconform("run", *args, "--out", str(out), "--reports-root", str(reports))
    line = one_line_refusal(proc, f"argument {flag}:")
    assert "## cleanup" not in proc.stdout and proc.stdout == "", proc.stdout
    assert "\n" not in line
    assert not out.exists() and not reports.exists(), "a refused run created its output"


@pytest.mark.parametrize(
    ("variable", "value", "target"),
    [
        ("HV_IMAGE", "bad\nimage:1", ["--runtime", "container"]),
        ("HV_GUEST_IMAGE", "hv-guest:1\x1b[2J", ["--target", "kind", "--dry-run"]),
        ("HV_KIND_NODE_IMAGE", "kindest/node:\n", ["--target", "kind", "--dry-run"]),
    ],
)
def test_a_bad_image_variable_is_refused_and_named(
    tmp_path: Path, variable: str, value: str, target: list[str]
) -> None:
    out = tmp_path / "out"
    proc = hvconform("run", *target, "--out", str(out), env={variable: value})
    one_line_refusal(proc, f"(the value of {variable})")
    assert not out.exists()


def test_manifests_refuses_a_bad_image_in_one_line() -> None:
    proc = hvconform("manifests", "--target", "kind", "--image", "hv:1\n---\nkind: Secret")
    one_line_refusal(proc, "hvconform manifests: image 'hv:1\\n---\\nkind: Secret'")
    assert proc.stdout == ""
