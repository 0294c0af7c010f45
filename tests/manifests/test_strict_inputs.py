"""One strict loader for everything read (issue 34, item 4): manifests, chart values and helm's
output go through the profiles' loader and limits, per file and per run; a chart or a values
file that would make helm read outside what was checked is refused before helm runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvconform.contract.safeyaml import (
    MAX_DOCUMENTS,
    MAX_FILE_BYTES,
    MAX_RUN_BYTES,
    Budget,
)
from hvconform.manifests.chart import (
    MAX_CHART_BYTES,
    MAX_CHART_FILES,
    MAX_GENERATE_NAME,
    ChartError,
    HelmMissing,
    chart_dir,
    helm_binary,
    template,
)
from hvconform.manifests.profile import _read_manifest, parse_objects
from hvconform.manifests.render import ManifestError

HVCONFORM = [sys.executable, "-m", "hvconform.cli"]
HEAD = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n"
# 9 levels of 9 aliases: about 500 bytes that any walk of the result (a deep copy, kubectl
# apply) expands to 9**9 strings. Its first anchor is on line 5.
BOMB = HEAD + "".join(
    f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9 if prev else ['"lol"'] * 9) + "]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)


def manifest(tmp_path: Path, text: str, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def objects(path: str, budget: Budget | None = None) -> list[dict[str, object]]:
    return parse_objects(_read_manifest(path), path, budget)


def config_map(name: str, **meta: str) -> str:
    return yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta | {"name": name}}
    )


def test_the_alias_bomb_is_refused_at_its_first_anchor_before_anything_expands(
    tmp_path: Path,
) -> None:
    assert len(BOMB.encode()) < 600
    with pytest.raises(ManifestError) as refused:
        objects(manifest(tmp_path, BOMB))
    line = str(refused.value)
    assert "line 5: anchors and aliases are not allowed" in line and "\n" not in line


def test_the_alias_bomb_fails_the_dry_run_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "ds.yaml").write_text(BOMB)
    profile = tmp_path / "bomb.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "bomb",
                "command": ["/usr/bin/bomb"],
                "resource": "example.org/kvm",
                "deploy": {
                    "image": "example.org/acme/bomb:1.0",
                    "manifests": ["deploy/ds.yaml"],
                    "pods": {"labels": {"app": "bomb"}, "container": "plugin"},
                },
            }
        )
    )
    proc = subprocess.run(
        [*HVCONFORM, "run", "--target", "kind", "--dry-run", "--plugin-profile", str(profile),
         "--reports-root", str(tmp_path / "reports")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "aliases are not allowed" in proc.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (HEAD + "  name: other\n", "line 5: duplicate key 'name'"),
        (HEAD + "data: {a: x, a: y}\n", "duplicate key 'a'"),
        (HEAD + "replicas: 1" + "0" * 100_000 + "\n", "an integer of more than 18 digits"),
        (HEAD + "x: 0x" + "f" * 40 + "\n", "an integer of more than 18 digits"),
        (HEAD + "x: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 64 levels"),
        (HEAD + "x: &a 1\n", "anchors and aliases are not allowed"),
        ("- just\n- a list\n", "object 1: not a mapping but list"),
        ("apiVersion: v1\nkind: 7\nmetadata: {name: a}\n", "kind is not a non-empty string"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: []\n", "metadata is not a mapping"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: 7}\n", "metadata.name is not a str"),
    ],
)
def test_what_the_profiles_loader_refuses_a_manifest_refuses(
    tmp_path: Path, text: str, needle: str
) -> None:
    with pytest.raises(ManifestError) as refused:
        objects(manifest(tmp_path, text))
    assert needle in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a%b", "Upper", "a_b", "-a", "a" * 254])
def test_a_name_that_is_not_an_object_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ManifestError, match=r"object 1 \('ConfigMap'\): (metadata\.name|no meta)"):
        objects(manifest(tmp_path, config_map(name)))


@pytest.mark.parametrize("prefix", ["Bad-", "a/", "-a", "a." * 200, "a" * (MAX_GENERATE_NAME + 1)])
def test_a_generate_name_that_is_not_a_prefix_is_refused(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(ManifestError, match=r"metadata\.generateName"):
        objects(manifest(tmp_path, config_map("", generateName=prefix)))


def test_valid_names_and_generate_names_are_accepted(tmp_path: Path) -> None:
    text = "---\n".join(
        [
            config_map("a.b-c", generateName="ignored-"),
            config_map("", generateName="hv-"),
            config_map("", generateName="a" * MAX_GENERATE_NAME),
            "apiVersion: v1\nkind: Pod\nmetadata: {generateName: probe-}\n",
            config_map("x" * 253),
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"
            "metadata: {name: 'system:hv-device-plugin'}\n",
            "",  # an empty document is no object
        ]
    )
    found = objects(manifest(tmp_path, text))
    assert [o["kind"] for o in found] == ["ConfigMap"] * 3 + ["Pod", "ConfigMap", "ClusterRole"]


def test_a_role_name_is_still_a_path_segment(tmp_path: Path) -> None:
    text = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: 'a/b'}\n"
    with pytest.raises(ManifestError, match=r"metadata\.name 'a/b'"):
        objects(manifest(tmp_path, text))


def test_the_object_cap_is_per_run_across_every_file(tmp_path: Path) -> None:
    paths = [
        manifest(tmp_path, "---\n".join(config_map(f"f{i}-{j}") for j in range(10)), f"{i}.yaml")
        for i in range(31)
    ]
    assert all(len(objects(p)) == 10 for p in paths), "each file alone is within the caps"
    budget = Budget()
    read = 0
    with pytest.raises(ManifestError) as refused:
        for path in paths:
            read += len(objects(path, budget))
    assert read == MAX_DOCUMENTS // 10 * 10
    assert f"more than {MAX_DOCUMENTS} objects in one run" in str(refused.value)
    assert paths[MAX_DOCUMENTS // 10] in str(refused.value), "the file that crossed it is named"


def test_the_byte_cap_is_per_run_across_every_file(tmp_path: Path) -> None:
    filler = "# " + "x" * (MAX_FILE_BYTES - 200) + "\n"
    paths = [manifest(tmp_path, config_map(f"f{i}") + filler, f"{i}.yaml") for i in range(6)]
    budget = Budget()
    read = 0
    with pytest.raises(ManifestError) as refused:
        for path in paths:
            read += len(objects(path, budget))
    assert read == MAX_RUN_BYTES // MAX_FILE_BYTES
    assert f"past {MAX_RUN_BYTES} bytes in all" in str(refused.value)


def test_a_manifest_larger_than_a_file_may_be_or_a_symlink_is_refused(tmp_path: Path) -> None:
    big = manifest(tmp_path, config_map("big") + "#" * MAX_FILE_BYTES + "\n", "big.yaml")
    with pytest.raises(ManifestError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        _read_manifest(big)
    link = tmp_path / "link.yaml"
    link.symlink_to(manifest(tmp_path, config_map("fine")))
    with pytest.raises(ManifestError, match="a symlink, refused"):
        _read_manifest(str(link))


# --- the chart and its values: checked before helm runs ------------------------------------


@pytest.fixture
def spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """helm behind a script that leaves a mark when it runs (HV_HELM): a refusal 'before helm
    runs' leaves none. A missing helm fails here: the tests never skip for it."""
    real = helm_binary()
    marker = tmp_path / "helm-ran"
    script = tmp_path / "helm-spy"
    script.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{real}" "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("HV_HELM", str(script))
    return marker


def chart_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "chart"
    shutil.copytree(chart_dir(), copy, symlinks=True)
    (copy / "files").mkdir()
    (copy / "templates" / "leak.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: leak\ndata:\n"
        '  shadow: {{ .Files.Get "files/shadow" | quote }}\n'
    )
    return copy


def test_a_chart_symlink_to_etc_shadow_is_refused_before_helm_runs(
    tmp_path: Path, spy: Path
) -> None:
    chart = chart_copy(tmp_path)
    (chart / "files" / "shadow").write_text("not-a-secret")
    assert "not-a-secret" in template("ns", chart=chart), "a template reads files/ as written"
    assert spy.exists()
    spy.unlink()
    (chart / "files" / "shadow").unlink()
    (chart / "files" / "shadow").symlink_to("/etc/shadow")
    with pytest.raises(ChartError) as refused:
        template("ns", chart=chart)
    assert not isinstance(refused.value, HelmMissing)
    assert f"'{chart / 'files' / 'shadow'}' is a symlink, refused" in str(refused.value)
    assert not spy.exists(), "helm ran"


def test_any_link_or_special_file_in_a_chart_is_refused(tmp_path: Path, spy: Path) -> None:
    chart = chart_copy(tmp_path)
    inside = chart / "templates" / "again.yaml"
    inside.symlink_to(chart / "templates" / "leak.yaml")  # even one that stays in the chart
    with pytest.raises(ChartError, match=r"again\.yaml' is a symlink"):
        template("ns", chart=chart)
    inside.unlink()
    os.mkfifo(chart / "files" / "pipe")
    with pytest.raises(ChartError, match="pipe' is not a regular file"):
        template("ns", chart=chart)
    assert not spy.exists()


def test_a_chart_past_its_file_count_or_size_is_refused(tmp_path: Path, spy: Path) -> None:
    chart = chart_copy(tmp_path)
    for i in range(MAX_CHART_FILES):
        (chart / "files" / f"f{i}").write_text("x")
    with pytest.raises(ChartError, match=f"more than {MAX_CHART_FILES} files"):
        template("ns", chart=chart)
    shutil.rmtree(chart / "files")
    (chart / "files").mkdir()
    (chart / "files" / "big").write_bytes(b"x" * MAX_CHART_BYTES)
    with pytest.raises(ChartError, match=f"at most {MAX_CHART_BYTES} bytes in all"):
        template("ns", chart=chart)
    assert not spy.exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("image: &i {tag: a}\nother: *i\n", "anchors and aliases are not allowed"),
        ("image: {tag: a}\nimage: {tag: b}\n", "duplicate key 'image'"),
        ("replicas: 1" + "0" * 30 + "\n", "more than 18 digits"),
        ("- a list\n", "not a mapping of values"),
        ("#" * (MAX_FILE_BYTES + 1), f"larger than {MAX_FILE_BYTES} bytes"),
    ],
)
def test_values_files_are_read_strictly_before_helm_runs(
    tmp_path: Path, spy: Path, content: str, needle: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(content)
    with pytest.raises(ChartError) as refused:
        template("ns", [values])
    assert needle in str(refused.value) and str(values) in str(refused.value)
    assert not spy.exists()


def test_a_values_file_that_is_a_symlink_or_a_fifo_is_refused(tmp_path: Path, spy: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nusers: [{name: me, user: {token: s3}}]\n")
    link = tmp_path / "values.yaml"
    link.symlink_to(kubeconfig)
    with pytest.raises(ChartError, match="a symlink, refused") as refused:
        template("ns", [link])
    assert "s3" not in str(refused.value)
    fifo = tmp_path / "values.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ChartError, match="not a regular file"):
        template("ns", [fifo])
    assert not spy.exists()
    plain = tmp_path / "plain.yaml"
    plain.write_text("{}\n")
    template("ns", [plain])  # a regular file of values is handed on: the spy sees helm run
    assert spy.exists()


def test_helm_output_past_the_run_cap_stops_helm(tmp_path: Path) -> None:
    chart = tmp_path / "big"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: big\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("size: 10\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n"
        '  blob: {{ repeat (int .Values.size) "x" | quote }}\n'
    )
    small = parse_objects(template("ns", chart=chart), "small")
    assert small[0]["data"] == {"blob": "x" * 10}
    with pytest.raises(ChartError) as refused:
        template("ns", values={"size": MAX_RUN_BYTES + 1}, chart=chart)
    assert f"output larger than {MAX_RUN_BYTES} bytes" in str(refused.value)


def test_a_profiles_manifests_share_one_budget_in_render_deploy(tmp_path: Path) -> None:
    """The issue's 31 files x 256 objects: each file alone within the caps, the profile not."""
    from hvconform.contract.deploy import Deploy, Pods
    from hvconform.manifests.profile import render_deploy

    paths = tuple(
        manifest(tmp_path, "---\n".join(config_map(f"f{i}-{j}") for j in range(10)), f"{i}.yaml")
        for i in range(31)
    )
    deploy = Deploy(image="x:1", pods=Pods({"app": "p"}, "plugin"), manifests={"*": paths})
    with pytest.raises(ManifestError, match=f"more than {MAX_DOCUMENTS} objects in one run"):
        render_deploy(deploy, "cluster", namespace="ns")
