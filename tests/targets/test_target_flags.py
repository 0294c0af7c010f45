"""Each target owns its flags (issue 37 item 1): its family's options module adds them to
`hvconform run` in a group named after it and builds its typed options object, which the run
context carries to every process of the run. The CLI and its parser name no target; a flag of
another target is refused (exit 2, one line) rather than ignored; --dry-run prints a plan for
every target and executes nothing."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvconform.cli_parser import build_parser
from hvconform.contract import runcontext
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.plugin import resolve
from hvconform.contract.runcontext import RunContext
from hvconform.contract.target_options import LocalOptions, NodeOptions
from hvconform.targets import TARGETS, OptionInputs, foreign_flags, target_options

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def _parse(*args: str) -> object:
    return build_parser(lambda ns: 0, env={}).parse_args(["run", *args])


def test_each_family_builds_its_own_typed_options(tmp_path: Path) -> None:
    inputs = OptionInputs("r1", tmp_path, resolve())
    local = target_options("local", _parse("--runtime", "container"), inputs)  # type: ignore[arg-type]
    assert local == LocalOptions(runtime="container", docker_host="")
    node = target_options("node", _parse("--node-runtime", "containerd-2.3"), inputs)  # type: ignore[arg-type]
    assert node == NodeOptions(node_runtime="containerd-2.3")
    kind = target_options("kind", _parse("--target", "kind", "--cluster-name", "c1"), inputs)  # type: ignore[arg-type]
    assert isinstance(kind, ClusterOptions) and kind.cluster_name == "c1"
    assert kind.workdir == str(tmp_path / "cluster") and kind.run_id == "r1"


@pytest.mark.parametrize(
    "options", [LocalOptions("container", "unix:///x.sock"), NodeOptions("containerd-2.3")]
)
def test_the_options_travel_typed_in_the_run_context(
    tmp_path: Path, options: LocalOptions | NodeOptions
) -> None:
    ctx = RunContext("r", str(tmp_path), "local", resolve(), options=options)
    back = runcontext.read(ctx.write())
    assert back == ctx and type(back.options) is type(options)
    assert back.cluster is None
    assert back.runtime == (options.runtime if isinstance(options, LocalOptions) else "process")


def test_a_flag_of_another_target_is_named() -> None:
    ns = _parse("--target", "node", "--kubeconfig", "k", "--docker-host", "unix:///d.sock")
    assert foreign_flags("node", ns) == ["--docker-host", "--kubeconfig"]  # type: ignore[arg-type]
    assert foreign_flags("local", _parse("--docker-host", "unix:///d.sock")) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--target", "node", "--kubeconfig", "k"), "--kubeconfig"),
        (("--target", "kind", "--node-runtime", "containerd-2.3"), "--node-runtime"),
        (("--target", "local", "--cluster-name", "x"), "--cluster-name"),
        # the cluster targets share one options module, yet each owns its own group
        (("--target", "kind", "--kubeconfig", "k"), "--kubeconfig"),
        (
            ("--target", "aks", "--resource-group", "g", "--cluster", "c", "--all-nodes"),
            "--all-nodes",
        ),
    ],
)
def test_a_run_refuses_a_flag_of_another_target(
    tmp_path: Path, args: tuple[str, ...], flag: str
) -> None:
    done = _run(*args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "a sandbox"),
        (("--runtime", "container"), "podman"),
        (("--target", "node"), "the kubelet v1.37.2"),
        (("--target", "node", "--node-runtime", "containerd-2.3"), "2.3"),
    ],
)
def test_every_machine_target_has_a_dry_run_plan(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    done = _run(*args, "--dry-run", "--reports-root", str(tmp_path / "reports"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("# hvconform plan: --target") and says in done.stdout
    assert "executes nothing" in done.stdout and "cleanup:" in done.stdout
    assert not (tmp_path / "reports").exists()  # nothing written


def test_the_help_groups_each_targets_options() -> None:
    text = (
        build_parser(lambda ns: 0, env={})
        ._subparsers._group_actions[0]
        .choices["run"]
        .format_help()
    )  # type: ignore[union-attr]
    for name in TARGETS:
        assert f"--target {name}" in text, name


def test_the_cli_and_its_parser_name_no_target() -> None:
    """No string in the CLI, its parser or the pytest plugin is a target's name: what differs
    by target is the registry's traits and each target's own options module."""
    for rel in ("cli.py", "cli_parser.py", "suite/pytest_plugin.py"):
        tree = ast.parse((ROOT / "conformance" / rel).read_text())
        # a record's field named like a family ({"cluster": ...} in results) is not a target
        keys = {id(k) for d in ast.walk(tree) if isinstance(d, ast.Dict) for k in d.keys if k}
        named = [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and n.value in TARGETS
            and id(n) not in keys
        ]
        assert named == [], (rel, named)


def test_the_default_target_is_the_registrys_first() -> None:
    ns = _parse()
    assert ns.target == "local" == next(iter(TARGETS))  # type: ignore[attr-defined]


def test_context_json_names_the_family() -> None:
    data = RunContext("r", "/tmp/r", "node", resolve(), options=NodeOptions()).to_json()
    assert json.loads(json.dumps(data))["options"] == {"family": "node", "node_runtime": ""}
