"""The suite's own image, built offline: `python -m hvconform.targets.kindnode.suite_image`
(`nox -s suite-image`).

hvconform with its conformance extra in a venv, and the pinned tools it drives against a cluster:
helm (the chart's render), kind, kubectl and crictl, copied from where this machine's builds put
them (kind and kubectl: `nox -s kind-image`, this package's builds; crictl: `nox -s node-build`;
helm: `nox -s helm`). It is made as the plugin image is (hvconform.targets.container.images):
the debootstrap base, a builder holding a wheelhouse (here of the conformance extra too), then
images/suite/Dockerfile with `network_mode=none`. /opt/hvconform/build-info.json names the source
commit and each tool's release, read from the binary's own Go build information and checked
against this repository's pins; `hvconform --version` prints it. A missing tool is one line and
exit 2, naming the session that builds it. The tag is `hvconform:<version>-<content key>`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import docker

from hv_device_plugin.api.names import installed_version
from hvconform.contract.buildinfo import BuildInfo, Tool
from hvconform.contract.datafiles import SHIPPED
from hvconform.targets.cluster.kindbin import KIND_BIN, KIND_VERSION
from hvconform.targets.container import images
from hvconform.targets.container.images import BuiltImage, Log
from hvconform.targets.kindnode import BIN
from hvconform.targets.kindnode.gobinary import NotGoBinary
from hvconform.targets.kindnode.gobinary import read as go_build
from hvconform.targets.realnode import BIN as NODE_BIN
from hvconform.targets.realnode import CRICTL_VERSION, KUBERNETES_VERSION, REPO

REPOSITORY = "hvconform"
DOCKERFILE = "images/suite/Dockerfile"
BUILDER_PREFIX = "hv-suite-build:"
# What setup.py and the wheel read beyond the plugin image's sources.
EXTRA_SOURCES = ("setup.py", "MANIFEST.in")
EXIT_MISSING = 2


@dataclass(frozen=True)
class ToolSpec:
    name: str
    path: Path
    module: str  # the Go module whose release the binary must be
    pin: str  # that release, as this repository pins it ("" : whatever the binary is)
    builds: str  # how to build it here


def tool_specs(helm: Path) -> tuple[ToolSpec, ...]:
    """The four tools, in the order `--version` lists them. helm's pin is the noxfile's (HELM),
    which passes the helm it built; the others are pinned in the package that builds them."""
    kind_image = "`nox -s kind-image` builds it"
    return (
        ToolSpec("helm", helm, "helm.sh/helm/v4", "", "`nox -s helm` builds it"),
        ToolSpec("kind", KIND_BIN, "sigs.k8s.io/kind", KIND_VERSION, kind_image),
        ToolSpec("kubectl", BIN / "kubectl", "k8s.io/kubernetes", KUBERNETES_VERSION, kind_image),
        ToolSpec(
            "crictl",
            NODE_BIN / "crictl",
            "sigs.k8s.io/cri-tools",
            CRICTL_VERSION,
            "`nox -s node-build` builds it",
        ),
    )


class ToolProblem(RuntimeError):
    """A tool is missing, or is not the pinned release: one line for the user."""


def inspect(spec: ToolSpec) -> Tool:
    """The tool's release from its binary, checked against the module and the pin."""
    if not spec.path.is_file():
        raise ToolProblem(f"suite-image: {spec.name} missing ({spec.path}): {spec.builds}")
    try:
        build = go_build(spec.path)
        module, version = build.release()
    except (NotGoBinary, OSError) as exc:
        raise ToolProblem(f"suite-image: {spec.name} at {spec.path}: {exc}") from None
    if module != spec.module:
        raise ToolProblem(
            f"suite-image: {spec.name} at {spec.path} is built from {module}, not {spec.module}"
        )
    if spec.pin and version != spec.pin:
        raise ToolProblem(
            f"suite-image: {spec.name} at {spec.path} is {version}, not the pinned {spec.pin}: "
            f"{spec.builds}"
        )
    return Tool(spec.name, version, module, build.go)


def source_commit(repo: Path = REPO) -> str:
    """HEAD, with -dirty when the checkout has changes (they are in the image too)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def suite_requirements(repo: Path = REPO) -> list[str]:
    """The plugin image's requirements and the conformance extra's."""
    import tomllib

    extra = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [*images.requirements(repo), *extra["conformance"]]


def wheel_sources(repo: Path = REPO) -> list[Path]:
    """The wheel's inputs with its data (setup.py copies SHIPPED into conformance/_data)."""
    files = images.source_files(repo)
    files += [Path(f) for f in EXTRA_SOURCES if (repo / f).is_file()]
    for rel in SHIPPED:
        path = repo / rel
        if path.is_file():
            files.append(Path(rel))
        elif path.is_dir():
            files += [p.relative_to(repo) for p in sorted(path.rglob("*"))
                      if p.is_file() and "__pycache__" not in p.parts]  # fmt: skip
    return sorted(set(files))


def context_files(info: BuildInfo, tools: dict[str, Path], repo: Path = REPO) -> dict[str, bytes]:
    files = {f"src/{rel}": (repo / rel).read_bytes() for rel in wheel_sources(repo)}
    files.update({f"bin/{name}": path.read_bytes() for name, path in tools.items()})
    files["build-info.json"] = (info.to_json() + "\n").encode()
    return files


def ensure_suite_image(
    client: docker.DockerClient,
    *,
    helm: Path,
    commit: str = "",
    base_image: str = "",
    cache_dir: Path = images.CACHE_DIR,
    log: Log = lambda line: print(f"suite-image: {line}", file=sys.stderr, flush=True),
) -> tuple[BuiltImage, BuildInfo]:
    """hvconform:<version>-<key>, built only when its inputs changed (raises ToolProblem first,
    before anything is built, when a tool is missing or not its pin)."""
    specs = tool_specs(helm)
    tools = tuple(inspect(spec) for spec in specs)
    info = BuildInfo(commit or source_commit(), tools)
    with images._cache_lock(cache_dir):
        base = (
            images.registry_base(client, base_image)
            if base_image
            else images.build_base(client, cache_dir, log)
        )
        wheels = images.wheelhouse(cache_dir, log, reqs=suite_requirements())
        builder = images.build_builder(client, base, wheels, log, tag_prefix=BUILDER_PREFIX)
        files = context_files(info, {s.name: s.path for s in specs})
        prefix = f"{REPOSITORY}:{installed_version()}-"
        built = images._build(client, "suite", prefix, DOCKERFILE, files, base, log,
                              buildargs={"BUILD_IMAGE": builder.tag})  # fmt: skip
        images._prune(client, REPOSITORY, images.KEEP)
        images._prune(client, BUILDER_PREFIX.rstrip(":"), images.KEEP)
    return built, info


def main(argv: Sequence[str] | None = None) -> int:
    from hvconform.manifests.chart import ChartError, helm_binary
    from hvconform.targets.container.engine import DockerEngine

    parser = argparse.ArgumentParser(
        prog="python -m hvconform.targets.kindnode.suite_image",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(
        "--helm", type=Path, help="the pinned helm (default: as hvconform finds it)"
    )
    parser.add_argument("--commit", default="", help="the source commit (default: git's HEAD)")
    parser.add_argument("--base-image", default="", help="a local registry base, not debootstrap")
    parser.add_argument("--cache-dir", type=Path, default=images.CACHE_DIR)
    parser.add_argument("--json", type=Path, help="write the tag, ID, tools and time here")
    args = parser.parse_args(argv)
    try:
        helm = args.helm or Path(helm_binary())
        for spec in tool_specs(helm):  # before the engine starts: a refusal costs nothing
            inspect(spec)
    except (ToolProblem, ChartError) as exc:
        print(str(exc).splitlines()[0], file=sys.stderr)
        return EXIT_MISSING
    t0 = time.monotonic()
    with DockerEngine(what="suite image") as engine:
        client = engine.client(timeout=1800)
        try:
            built, info = ensure_suite_image(
                client, helm=helm, commit=args.commit, base_image=args.base_image,
                cache_dir=args.cache_dir,
            )  # fmt: skip
        finally:
            client.close()
    seconds = round(time.monotonic() - t0, 1)
    state = "cached" if built.cached else "built"
    print(f"{built.tag} {built.id[:19]} {state} in {seconds}s (commit {info.commit})")
    for line in info.lines():
        print(line)
    if args.json:
        data = {"tag": built.tag, "id": built.id, "cached": built.cached, "seconds": seconds,
                "build_info": json.loads(info.to_json())}  # fmt: skip
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
