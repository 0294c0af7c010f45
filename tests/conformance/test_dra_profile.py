"""A DRA driver described by a profile (issue 28): its `dra` section read and refused as any
profile value is, its API known to every target (a target without a DRA side refuses it before
anything runs), and each check of the catalogue saying which API it judges."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvconform.contract.dra import CAP_DRA, plugin_api
from hvconform.contract.dra_profile import API_DEVICE_PLUGIN, API_DRA
from hvconform.contract.plugin import SHIPPED_DRA, PluginUnderTest, ProfileError, load_profile
from hvconform.scenarios import BY_ID, CATALOGUE, readme_table
from hvconform.targets.honour import refusal


def _write(tmp_path: Path, dra: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f'name: d\ncommand: ["/bin/driver"]\ndra: {dra}\n')
    return path


def test_the_shipped_driver_profile_is_a_dra_driver_and_round_trips() -> None:
    plugin = load_profile(SHIPPED_DRA)
    assert plugin.api == API_DRA and plugin.dra is not None
    assert plugin.resource == plugin.dra.extended_resource == "hyperlight.dev/hypervisor"
    assert plugin.dra.endpoint_dir == "/var/lib/kubelet/plugins/hypervisor.hyperlight.dev"
    assert PluginUnderTest.from_json(plugin.to_json()) == plugin
    argv = plugin.argv("10.0.0.2:8080", {"node_name": "n1", "kube_api_server": "https://a"})
    assert argv[argv.index("--node-name") + 1] == "n1"
    assert "{" not in " ".join(argv[: argv.index("--kube-ca-file")])


@pytest.mark.parametrize(
    ("dra", "said"),
    [
        ("{extendedResource: a.io/x}", "'driver' is required"),
        ("{driver: Bad_Name, extendedResource: a.io/x}", "DNS subdomain"),
        ("{driver: d.io, extendedResource: kubernetes.io/x}", "not an extended resource"),
        ("{driver: d.io, extendedResource: a.io/x, pluginDir: /var/lib/kubelet/plugins_registry/d}",
         "must not be the registration dir or inside it"),
        ("{driver: d.io, extendedResource: a.io/x, pluginDir: /proc/x}", "dra.pluginDir"),
        ("{driver: d.io, extendedResource: a.io/x, nope: 1}", "unknown key"),
        ("[1]", "want a mapping"),
    ],
)  # fmt: skip
def test_a_bad_dra_section_is_refused_in_one_line(tmp_path: Path, dra: str, said: str) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(_write(tmp_path, dra))
    assert said in str(err.value) and "\n" not in str(err.value)


def test_a_resource_other_than_the_extended_resource_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text('command: ["/bin/d"]\nresource: a.io/y\ndra: {driver: d.io, '
                    "extendedResource: a.io/x}\n")  # fmt: skip
    with pytest.raises(ProfileError, match=r"dra\.extendedResource"):
        load_profile(path)


@pytest.mark.parametrize(
    ("target", "runtime"),
    [("local", "process"), ("local", "container"), ("aks", "process"), ("cluster", "container")],
)  # fmt: skip
def test_targets_without_a_dra_side_refuse_a_driver(target: str, runtime: str) -> None:
    why = refusal(load_profile(SHIPPED_DRA), target, runtime)
    assert why.startswith("dra: ") and "--target node" in why


@pytest.mark.parametrize("target", ["node", "kind", "cluster"])
def test_the_node_kind_and_cluster_targets_run_a_driver(target: str) -> None:
    assert refusal(load_profile(SHIPPED_DRA), target, "process") == ""


def test_every_check_names_the_apis_it_judges() -> None:
    for check in CATALOGUE:
        assert check.apis and set(check.apis) <= {API_DEVICE_PLUGIN, API_DRA}, check.id
    dra_only = {c.id for c in CATALOGUE if c.apis == (API_DRA,)}
    assert dra_only == {"dra-kubelet-restart", "dra-pod-while-kubelet-down", "dra-shared-device",
                        "dra-prepare-retried", "dra-no-spec-left", "dra-unprepare-retried",
                        "dra-registration-socket-removed"}  # fmt: skip
    # the device plugin API's own: a DRA driver has no ListAndWatch stream, no kubelet.sock
    for check_id in ("stream-lost", "registration-failure", "restart-kubelet"):
        assert API_DRA not in BY_ID[check_id].apis
    for check_id in ("cdi-missing", "device-unusable", "restart-plugin", "preservation"):
        assert BY_ID[check_id].apis == (API_DEVICE_PLUGIN, API_DRA)
    assert "| dra-no-spec-left | cdi | extended |  | dra |" in readme_table()


class _Caps:
    def __init__(self, caps: frozenset[str]) -> None:
        self.capabilities = caps


def test_the_api_of_a_node_is_its_capability() -> None:
    assert plugin_api(_Caps(frozenset({CAP_DRA}))) == API_DRA  # type: ignore[arg-type]
    assert plugin_api(_Caps(frozenset())) == API_DEVICE_PLUGIN  # type: ignore[arg-type]
