"""Every documented image build, and the workflows' image steps, run exactly as written in a
clean checkout, against the harness's engine, with the offline base given through the
documented build arguments (BASE_IMAGE, BUILD_IMAGE) and nothing else changed.

A checkout with nothing prepared must be enough: no wheelhouse, no egg-info, no cache (the clean
checkout is what `git ls-files` lists, committed afresh, so `git rev-parse HEAD` works in it).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.container import documented
from tests.container.documented import (  # noqa: F401 - builds is the fixture
    Builds,
    builds,
    engine_builds,
    version_of,
)
from tests.workflows import actions

pytestmark = [pytest.mark.root, pytest.mark.slow]
DIGEST_PIN = re.compile(r"python:3\.11-slim@sha256:[0-9a-f]{64}")


def test_the_documented_commands_are_found() -> None:
    found = documented.documented_builds()
    files = {d.where.split(":")[0] for d in found}
    assert {"kind/README.md", "plugin/Dockerfile", "images/guest/Dockerfile"} <= files
    assert all("--network" not in d.command for d in found), "documented builds need no flags"


@pytest.mark.parametrize("doc", documented.documented_builds(), ids=lambda d: d.where)
def test_documented_build_runs_as_written(
    builds: Builds,  # noqa: F811
    doc: documented.Documented,
) -> None:
    tag = builds.run(doc.where, doc.command, ACR="myregistry")
    if "images/guest/Dockerfile" in doc.command:
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--read-only", tag, "--help"],
            env=builds.env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert "Run a real guest" in done.stdout, done.stderr
        return
    out = version_of(builds, tag)
    assert out.startswith("hv-device-plugin 0.1.0"), out
    if "SOURCE_COMMIT" in doc.command:
        assert builds.commit in out, out


def test_kind_workflow_builds_the_image_it_names(
    builds: Builds,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = actions.load("conformance-kind.yml")
    job = workflow["jobs"]["image"]  # its `kind` job calls hvconform-plugin.yml with the image
    step = actions.step_by_id(job, "image")
    runner = actions.Runner(tmp_path / "runner", [builds.shims])
    t0 = time.monotonic()
    with engine_builds():
        done = runner.run(
            workflow, job, step, {}, builds.env(GITHUB_SHA=builds.commit), builds.checkout
        )
    builds.seconds["conformance-kind.yml image"] = time.monotonic() - t0
    tag = workflow["env"]["PLUGIN_IMAGE"]
    builds.tags.add(tag)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert builds.commit in version_of(builds, tag)


def test_every_image_step_of_the_workflows_is_tested() -> None:
    """A new step that builds, loads or pushes an image must be added to IMAGE_STEPS (and so
    run by a test), never slip in untested."""
    for path in sorted(documented.WORKFLOWS.glob("*.yml")):
        every = [
            s for job in actions.load(path.name)["jobs"].values() for s in job.get("steps", [])
        ]
        steps = [s.get("id") for s in every if documented.IMAGE_VERBS.search(s.get("run", ""))]
        scripts = [s.get("id") for s in every if "push-image.sh" in s.get("run", "")]
        assert sorted(steps + scripts) == sorted(documented.IMAGE_STEPS.get(path.name, [])), (
            path.name
        )


def test_base_pins_are_one_digest() -> None:
    """The registry base is pinned by digest everywhere it is a default, to the same digest."""
    pins = set()
    for dockerfile in ("plugin/Dockerfile", "images/guest/Dockerfile", "images/suite/Dockerfile"):
        text = (documented.ROOT / dockerfile).read_text()
        defaults = re.findall(r"^ARG (?:BASE|BUILD)_IMAGE=(\S+)$", text, re.M)
        assert defaults and all(DIGEST_PIN.fullmatch(d) for d in defaults), (dockerfile, defaults)
        pins |= set(defaults)
    assert len(pins) == 1, pins
