"""The AKS workflow's image steps, run as written: the inputs check refuses a run that cannot
finish with one line, the registry step asks Azure (a stand-in `az`) for the login server, the
build step builds the commit, and the push step pushes to a real registry on loopback and hands
the conformance step a reference by digest that the registry really serves.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvconform.manifests import render_objects
from tests.container import registry
from tests.container.documented import (  # noqa: F401 - builds is the fixture
    Builds,
    builds,
    engine_builds,
    version_of,
)
from tests.workflows import actions

pytestmark = [pytest.mark.root, pytest.mark.slow]
AKS = actions.load("conformance-aks.yml")
_, JOB = actions.only_job(AKS)
CONTEXTS = {
    "inputs.resource-group": "rg-conform",
    "inputs.cluster": "aks-conform",
    "inputs.region": "westeurope",
    "inputs.hypervisor": "kvm",
    "inputs.registry": "hvconformacr",
    "vars.AZURE_CLIENT_ID": "00000000-0000-0000-0000-000000000001",
    "vars.AZURE_TENANT_ID": "00000000-0000-0000-0000-000000000002",
    "vars.AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000003",
}
FAKE_AZ = """#!{python}
import sys
from pathlib import Path

argv = sys.argv[1:]
with Path({log!r}).open("a") as fh:
    fh.write(" ".join(argv) + "\\n")
opts = dict(zip(argv[2::2], argv[3::2]))
if argv[:2] == ["acr", "show"] and opts == {{"--name": "hvconformacr", "--query": "loginServer",
                                             "--output": "tsv"}}:
    print({server!r})
elif argv[:2] == ["acr", "login"] and opts == {{"--name": "hvconformacr"}}:
    print("Login Succeeded")
else:
    sys.exit(99)
"""


Outputs = dict[str, str]


def run_step(
    runner: actions.Runner,
    step_id: str,
    contexts: dict[str, str],
    env: dict[str, str],
    workspace: Path = actions.ROOT,
) -> tuple[subprocess.CompletedProcess[str], Outputs]:
    """One step with a fresh GITHUB_OUTPUT; its outputs."""
    out = runner.root / f"output-{step_id}"
    out.write_text("")
    with engine_builds():  # the image and push steps, one at a time with other builds
        done = runner.run(AKS, JOB, actions.step_by_id(JOB, step_id), contexts,
                          {**env, "GITHUB_OUTPUT": str(out)}, workspace)  # fmt: skip
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return done, outputs


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ({"inputs.registry": ""}, "missing input registry"),
        (
            {"inputs.cluster": "", "vars.AZURE_CLIENT_ID": ""},
            "missing input cluster,variable AZURE_CLIENT_ID",
        ),
        ({"inputs.registry": "my-acr;rm"}, "input registry 'my-acr;rm' is not an ACR name"),
    ],
)
def test_inputs_refuse_with_one_line(tmp_path: Path, missing: dict[str, str], named: str) -> None:
    runner = actions.Runner(tmp_path)
    done, _ = run_step(runner, "inputs", {**CONTEXTS, **missing}, {})
    assert done.returncode == 2
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].startswith("::error"), lines


def test_inputs_come_first_and_pass_when_complete(tmp_path: Path) -> None:
    assert JOB["steps"][0]["id"] == "inputs"
    done, _ = run_step(actions.Runner(tmp_path), "inputs", CONTEXTS, {})
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_build_push_and_deploy_by_digest(builds: Builds, tmp_path: Path) -> None:  # noqa: F811
    tools = tmp_path / "tools"
    tools.mkdir()
    with registry.serve(tmp_path / "registry") as (server, reg):
        az_log = tmp_path / "az.log"
        actions.write_tool(tools / "az", FAKE_AZ.format(python=sys.executable, log=str(az_log),
                                                        server=server))  # fmt: skip
        runner = actions.Runner(tmp_path / "runner", [builds.shims, tools])
        env = builds.env(GITHUB_SHA=builds.commit)
        env["PATH"] = f"{tools}:{env['PATH']}"
        done, out = run_step(runner, "registry", CONTEXTS, env, builds.checkout)
        assert done.returncode == 0, done.stderr
        tag = out["tag"]
        assert tag == f"{server}/hv-device-plugin:{builds.commit}"
        assert az_log.read_text().splitlines() == [
            "acr show --name hvconformacr --query loginServer --output tsv",
            "acr login --name hvconformacr",
        ]
        contexts = {**CONTEXTS, "steps.registry.outputs.tag": tag}
        t0 = time.monotonic()
        done, _ = run_step(runner, "image", contexts, env, builds.checkout)
        builds.seconds["conformance-aks.yml image"] = time.monotonic() - t0
        builds.tags.add(tag)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert builds.commit in version_of(builds, tag)
        t0 = time.monotonic()
        done, out = run_step(runner, "push", contexts, env, builds.checkout)
        builds.seconds["conformance-aks.yml push"] = time.monotonic() - t0
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        image = out["image"]
        repository, _, digest = image.partition("@")
        assert repository == f"{server}/hv-device-plugin"
        # The digest is the one the registry computed over the manifest it received.
        assert digest == reg.manifest_digest("hv-device-plugin", builds.commit)
    # The conformance step deploys exactly that reference.
    step = actions.step_by_id(JOB, "conformance")
    assert step["env"]["PLUGIN_IMAGE"] == "${{ steps.push.outputs.image }}"
    assert '--image "$PLUGIN_IMAGE"' in step["run"]
    objs = render_objects("aks", image=image)
    images = {c["image"] for o in objs if o["kind"] == "DaemonSet"
              for c in o["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert images == {image}
