"""Run the KIND workflow's `run:` steps here, in the workflow's order, with the workflow's env:
what CI does is what ran on this machine (issue 19). The steps are the reusable workflow's
(.github/workflows/hvconform-plugin.yml), with the inputs .github/workflows/conformance-kind.yml
calls it with (`${{ inputs.X }}`).

    python -m hvconform.targets.kindnode.workflow [--env KEY=VALUE ...] [--json FILE]

GitHub's runner is imitated as far as the steps read it: a bash shell (-eo pipefail) in the
repository, RUNNER_TEMP, GITHUB_SHA, GITHUB_PATH/GITHUB_ENV (read back after every step),
GITHUB_STEP_SUMMARY, `if:` conditions of the forms the workflow uses (always(), success(),
steps.ID.outcome == '...'), `${{ env.X }}`, `${{ steps.X.outcome }}`, `${{ runner.temp }}`,
`${{ inputs.X }}`, `${{ github.workspace }}` and
timeout-minutes. `uses:` steps are GitHub actions: listed, not run (checkout: this checkout;
setup-python: a venv of its own first on PATH; setup-go: the machine's go; upload-artifact: the
files stay where the steps wrote them). Three things differ here, each named in the output:

- KIND_NODE_IMAGE is the offline image of `nox -s kind-image` (kindest/node cannot be pulled);
- "Load the plugin image" (the caller's job built it on a registry base) is replaced by the
  offline build of `nox -s image`, tagged $PLUGIN_IMAGE in the kind engine, with the guest image
  beside it (named to later steps as HV_GUEST_IMAGE, through GITHUB_ENV);
- "Enable KVM for the runner user" is skipped: its udev rule makes /dev/kvm 0666, and this
  machine's /dev/kvm must stay as it is (its steps run as root, which needs no rule).

Everything runs under the kind engine (DOCKER_HOST) with a KUBECONFIG of its own, so the host's
~/.kube/config is never written; afterwards the engine is checked for leftovers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker
import yaml

from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.kindnode import CACHE, NODE_IMAGE
from hvconform.targets.kindnode.engine import (
    copy_image,
    device_metadata,
    inventory,
    kind_engine,
    leftovers,
)
from hvconform.targets.realnode import REPO
from hvconform.targets.realnode.node_images import build_images

WORKFLOW = REPO / ".github" / "workflows" / "hvconform-plugin.yml"
JOB = "conformance"
CALLER = REPO / ".github" / "workflows" / "conformance-kind.yml"
CALLER_JOB = "kind"
SKIPPED = {
    "Enable KVM for the runner user": "its udev rule would make /dev/kvm 0666; this machine's "
    "/dev/kvm stays 600 root:root, and the steps run as root",
}
REPLACED = {
    "Load the plugin image": "offline build (nox -s image), tagged $PLUGIN_IMAGE, and the guest"
}
# The suite's checkout is this one (the checkout action is not run here).
OVERRIDES = {"KIND_NODE_IMAGE": NODE_IMAGE, "HVCONFORM_SUITE": str(REPO)}
_EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")
_OUTCOME = re.compile(r"steps\.([\w-]+)\.outcome\s*==\s*'(\w+)'")


@dataclass
class StepResult:
    name: str
    id: str
    how: str  # ran, replaced, skipped, action, not-run
    outcome: str  # success, failure, skipped
    seconds: float
    note: str = ""


def call_inputs(env: dict[str, str]) -> dict[str, str]:
    """The reusable workflow's inputs as the caller gives them, over their defaults."""
    called = yaml.safe_load(WORKFLOW.read_text())
    on = called.get("on", called.get(True, {}))
    declared = on["workflow_call"]["inputs"]
    given = yaml.safe_load(CALLER.read_text())["jobs"][CALLER_JOB].get("with", {})
    out = {k: str(v.get("default", "")) for k, v in declared.items()}
    out.update({k: expand(str(v), env, {}) for k, v in given.items()})
    return out


def expand(
    text: str, env: dict[str, str], outcomes: dict[str, str], inputs: dict[str, str] | None = None
) -> str:
    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr.startswith("env."):
            return env.get(expr[4:], "")
        if expr.startswith("inputs.") and inputs is not None and expr[7:] in inputs:
            return inputs[expr[7:]]
        if expr == "github.workspace":
            return env["GITHUB_WORKSPACE"]
        if m := re.fullmatch(r"steps\.([\w-]+)\.outcome", expr):
            return outcomes.get(m.group(1), "")
        if expr == "runner.temp":
            return env["RUNNER_TEMP"]
        if expr == "github.sha":
            return env["GITHUB_SHA"]
        raise ValueError(f"expression not supported by this runner: {expr}")

    return _EXPR.sub(one, text)


def should_run(condition: str, failed: bool, outcomes: dict[str, str]) -> bool:
    """GitHub's default is success(); the workflow's other forms are always() [&& outcomes]."""
    cond = condition.strip()
    if not cond:
        return not failed
    if cond.startswith("${{"):
        cond = cond[3:].rstrip("}").strip()
    terms = [t.strip() for t in cond.split("&&")]
    ok = True
    for term in terms:
        if term == "always()":
            continue
        if term == "success()":
            ok = ok and not failed
        elif m := _OUTCOME.fullmatch(term):
            ok = ok and outcomes.get(m.group(1), "") == m.group(2)
        else:
            raise ValueError(f"if: not supported by this runner: {term}")
    return ok if "always()" in terms else ok and not failed


def plugin_image(tag: str, engine: DockerEngine, github_env: Path) -> None:
    """The replacement of "Load the plugin image": `nox -s image`'s build, tagged `tag`, and its
    guest image, named to the later steps as HV_GUEST_IMAGE (the step's GITHUB_ENV)."""
    built = build_images()
    with DockerEngine(what="workflow plugin image") as suite_engine:
        copy_image(built["plugin"], suite_engine, engine)
        copy_image(built["guest"], suite_engine, engine)
    client = engine.client(timeout=120)
    try:
        client.images.get(built["plugin"]).tag(*tag.rsplit(":", 1))
    finally:
        client.close()
    with github_env.open("a") as fh:
        fh.write(f"HV_GUEST_IMAGE={built['guest']}\n")


def _read_files(env: dict[str, str]) -> None:
    """GITHUB_PATH and GITHUB_ENV as the runner applies them before the next step."""
    for line in Path(env["GITHUB_PATH"]).read_text().splitlines():
        if line.strip() and line not in env["PATH"].split(":"):
            env["PATH"] = f"{line.strip()}:{env['PATH']}"
    for line in Path(env["GITHUB_ENV"]).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value


def run_steps(
    steps: list[dict[str, Any]],
    env: dict[str, str],
    replace: Callable[[str, dict[str, str]], None],
    log: Callable[[StepResult], None],
    inputs: dict[str, str] | None = None,
) -> list[StepResult]:
    results: list[StepResult] = []
    outcomes: dict[str, str] = {}
    failed = False
    for step in steps:
        name, sid = step.get("name", step.get("uses", "?")), step.get("id", "")
        if "uses" in step:
            result = StepResult(name, sid, "action", "skipped", 0.0, step["uses"].split("@")[0])
        elif name in SKIPPED:
            result = StepResult(name, sid, "skipped", "skipped", 0.0, SKIPPED[name])
        elif not should_run(str(step.get("if", "")), failed, outcomes):
            result = StepResult(name, sid, "not-run", "skipped", 0.0, f"if: {step.get('if', '')}")
        else:
            step_env = {**env, **{k: expand(str(v), env, outcomes, inputs)
                                  for k, v in step.get("env", {}).items()}}  # fmt: skip
            t0 = time.monotonic()
            outcome, note = "success", ""
            try:
                if name in REPLACED:
                    replace(name, step_env)
                    how, note = "replaced", REPLACED[name]
                else:
                    how = "ran"
                    script = expand(str(step["run"]), env, outcomes, inputs)
                    timeout = float(step.get("timeout-minutes", 360)) * 60
                    argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script]
                    rc = subprocess.run(argv, cwd=REPO, env=step_env, timeout=timeout).returncode
                    if rc != 0:
                        outcome, note = "failure", f"exit {rc}"
            except (subprocess.TimeoutExpired, RuntimeError, docker.errors.DockerException) as exc:
                how, outcome, note = "ran", "failure", str(exc)[:300]
            result = StepResult(name, sid, how, outcome, round(time.monotonic() - t0, 1), note)
            failed = failed or outcome == "failure"
            _read_files(env)
        if sid:
            outcomes[sid] = result.outcome
        results.append(result)
        log(result)
    return results


def _go_caches() -> dict[str, str]:
    out = subprocess.run(["go", "env", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True,
                         check=False).stdout.split()  # fmt: skip
    return dict(zip(("GOMODCACHE", "GOCACHE"), out, strict=False)) if len(out) == 2 else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kind-workflow", description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE over the workflow")
    parser.add_argument("--json", type=Path, help="write the steps' results here")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env if "=" in item)
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"][JOB]
    steps = job["steps"]
    t0 = time.monotonic()
    engine = kind_engine("kind-workflow")
    host = engine.acquire()
    try:
        with tempfile.TemporaryDirectory(prefix="hv-kind-workflow-") as tmp:
            temp = Path(tmp)
            for f in ("path", "env", "summary"):
                (temp / f).write_text("")
            venv = CACHE / "workflow-venv"  # setup-python's interpreter, first on PATH
            if not (venv / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True, check=True).stdout.strip()  # fmt: skip
            env = {
                **os.environ,
                **{k: str(v) for k, v in workflow.get("env", {}).items()},
                "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
                "DOCKER_HOST": host,
                "KUBECONFIG": str(temp / "kubeconfig"),
                "RUNNER_TEMP": str(temp / "runner"),
                "GITHUB_SHA": sha,
                "GITHUB_WORKSPACE": str(REPO),
                "GITHUB_PATH": str(temp / "path"),
                "GITHUB_ENV": str(temp / "env"),
                "GITHUB_STEP_SUMMARY": str(temp / "summary"),
                "CI": "true",
                # `go install` in the steps lands in the run's own GOPATH, never the host's
                # ~/go/bin (a kind left there once came first on PATH for every later run);
                # the module and build caches are shared, as they are only caches.
                **_go_caches(),
                "GOPATH": str(temp / "gopath"),
            }
            inputs = call_inputs(env)
            # the job's env, its expressions filled in (inputs, github.workspace), then ours
            env.update({k: expand(str(v), env, {}, inputs) for k, v in job.get("env", {}).items()})
            env.update({**OVERRIDES, **extra})
            (temp / "runner").mkdir()
            before, kvm_before = inventory(engine), device_metadata()
            print(json.dumps({"event": "workflow", "workflow": str(WORKFLOW.relative_to(REPO)),
                              "overrides": {**OVERRIDES, **extra}, "engine": host}), flush=True)  # fmt: skip
            results = run_steps(
                steps,
                env,
                lambda name, step_env: plugin_image(
                    step_env["PLUGIN_IMAGE"], engine, Path(step_env["GITHUB_ENV"])
                ),
                lambda r: print(json.dumps({"event": "step", **asdict(r)}), flush=True),
                inputs,
            )
            kubeconfig = Path(env["KUBECONFIG"])
            kube_left = kubeconfig.exists() and env["KIND_CLUSTER"] in kubeconfig.read_text()
            summary = (temp / "summary").read_text()
        left, kvm_after = leftovers(engine, before), device_metadata()
    finally:
        engine.release()
    ok = all(r.outcome != "failure" for r in results)
    clean = not any(left.values()) and kvm_before == kvm_after and not kube_left
    report = {"ok": ok, "clean": clean, "seconds": round(time.monotonic() - t0, 1),
              "left": left, "kubeconfig_entry_left": kube_left, "kvm_before": kvm_before,
              "kvm_after": kvm_after, "steps": [asdict(r) for r in results],
              "step_summary": summary}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({"event": "workflow-done", **{k: v for k, v in report.items()
                                                     if k not in ("steps", "step_summary")}}))  # fmt: skip
    return 0 if ok and clean else 1


if __name__ == "__main__":
    sys.exit(main())
