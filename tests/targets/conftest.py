"""Fixtures of the recorded-contract tests: fake executables on PATH and the API stand-in."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.targets import TARGETS
from hvconform.targets.cluster.plan import ClusterOptions
from tests.targets.fake_kube import FakeKube
from tests.targets.fakes import CONTRACTS, install_fakes, load_rules, read_log

RUN_ID = "c0ffee01"


def recorded_objects(
    namespace: str, hypervisor: str = "kvm", image: str = "hv-device-plugin:0.1.0"
) -> list[dict[str, Any]]:
    """The recorded render_objects output (fixtures/contracts/manifests.yaml) for one target."""
    text = (CONTRACTS / "manifests.yaml").read_text()
    for key, value in {
        "NAMESPACE": namespace,
        "HYPERVISOR": hypervisor,
        "DEVICE": f"/dev/{hypervisor}",
        "IMAGE": image,
    }.items():
        text = text.replace("${" + key + "}", value)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def contract_options(target: str, tmp_path: Path, **kw: Any) -> ClusterOptions:
    base: dict[str, Any] = {
        "target": target,
        "image": "hv-device-plugin:0.1.0",
        "run_id": RUN_ID,
        "workdir": str(tmp_path / "work"),
        "contract": True,
        "kind_config": "kind/cluster.yaml",
        "resource_group": "rg-contract",
        "cluster": "aks-contract",
        "poll_interval": 0.01,
        "rollout_timeout": 3.0,
        "pod_timeout": 3.0,
        "delete_timeout": 3.0,
        # as the registry resolves them for the target (hvconform.targets.cluster_options)
        "default_namespace": TARGETS[target].plugin_namespace,
    }
    base.update(kw)
    return ClusterOptions(**base)


class FakeMetadata:
    """Stands in for TwoPhase in kind runs: records the calls, answers accepted verdicts."""

    @dataclass
    class Verdict:
        status: str = "accepted"
        message: str = "accepted: unchanged"

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def snapshot_original(self) -> object:
        self.calls.append(("snapshot_original", None))
        if self.fail == "snapshot":
            raise RuntimeError("injected: /dev/kvm could not be lstat'ed")
        return {}

    def check_startup(self, node_kvm_gid: int | str | None = None) -> object:
        self.calls.append(("check_startup", node_kvm_gid))
        if not node_kvm_gid:  # as TwoPhase: a failed lookup is an error verdict, never a gid
            return self.Verdict("error", "error: group lookup is empty")
        return self.Verdict()

    def check_final(self) -> object:
        self.calls.append(("check_final", None))
        return self.Verdict()

    def summary(self) -> dict[str, Any]:
        return {"calls": [c[0] for c in self.calls]}


@dataclass
class Recorded:
    """One recorded-contract environment: fake executables, API stand-in, logs."""

    tmp: Path
    target: str
    kube: FakeKube
    rules: dict[str, Any]
    mp: pytest.MonkeyPatch
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> list[list[str]]:
        return read_log(Path(self.env["HV_FAKE_LOG"]))

    def commands(self, prog: str) -> list[str]:
        return [" ".join(argv[1:]) for argv in self.log if argv[0] == prog]

    def fail_command(self, regex: str) -> None:
        self.mp.setenv("HV_FAKE_FAIL", regex)

    def fail_request(self, regex: str, status: int = 500) -> None:
        self.kube.fail, self.kube.fail_status = regex, status

    def run_objects(self) -> list[str]:
        """Paths of objects the run created in the stand-in (stamped by it) and left behind."""
        made = "00000000-0000-4000-8000-"
        objects = self.kube.state.objects.items()
        return sorted(p for p, o in objects if str(o["metadata"].get("uid", "")).startswith(made))


@pytest.fixture
def recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Recorded]:
    param: tuple[str, dict[str, Any]] = getattr(request, "param", ("kind", {}))
    target, overrides = param
    rules = load_rules(target, overrides)
    kube_data: dict[str, Any] = json.loads((CONTRACTS / "kube.json").read_text())
    recorded_api = {**kube_data[target], "logs": kube_data["logs"], **overrides.get("api", {})}
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps(rules))
    state = tmp_path / "fake-state"
    state.mkdir()
    bin_dir = tmp_path / "bin"
    install_fakes(bin_dir, ("kind", "docker", "az"))
    with FakeKube(recorded_api, rules) as kube:
        env = {
            "HV_FAKE_LOG": str(tmp_path / "commands.jsonl"),
            "HV_FAKE_RULES": str(rules_file),
            "HV_FAKE_STATE": str(state),
            "HV_FAKE_KUBECONFIG": str(kube.kubeconfig(tmp_path / "fake-kubeconfig")),
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("HV_FAKE_FAIL", raising=False)
        monkeypatch.delenv("HV_FAKE_SIGTERM", raising=False)
        yield Recorded(tmp_path, target, kube, rules, monkeypatch, env)
