"""What the documentation and the workflows tell people to run to build an image, and a clean
checkout to run it in.

The commands are read from the files themselves (fenced `sh` blocks of the Markdown files, the
usage lines of the Dockerfiles, the workflows' `run:` steps), so a command changed in a README is
the command tested. The only thing added is the offline base: a `docker` shim first on PATH puts
`--build-arg BASE_IMAGE=... --build-arg BUILD_IMAGE=...` (the documented build arguments) in
front of the arguments of `docker build`; everything else reaches the real docker untouched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from hvconform.targets.container import images as img
from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.container.images import BuiltImage, ImageSet

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "CONTRIBUTING.md",
    "kind/README.md",
    "aks/README.md",
    "gobuild/README.md",
    "charts/hv-device-plugin/README.md",
)
DOCKERFILES = ("plugin/Dockerfile", "images/guest/Dockerfile", "images/build/Dockerfile")
WORKFLOWS = ROOT / ".github" / "workflows"
# The steps that build, load or push an image, by workflow and step id.
IMAGE_STEPS = {"conformance-kind.yml": ["image"], "conformance-aks.yml": ["image", "push"]}
IMAGE_VERBS = re.compile(
    r"\b(docker (build|load|push|import|save)|kind load|podman (build|load))\b"
)
_FENCE = re.compile(r"^```(?:sh|bash|console)?\s*$")


@dataclass(frozen=True)
class Documented:
    where: str  # file:line
    command: str  # one logical line, continuations joined, exactly as written


def _logical_lines(lines: list[str]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        out.append((start, (pending + line.strip()).strip()))
        pending = ""
    return out


def shell_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every logical line in the fenced shell blocks of a Markdown file."""
    found: list[tuple[int, str]] = []
    block: list[str] = []
    first, fenced, shell = 0, False, False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):  # fences may be indented (inside a list)
            if fenced and shell:
                found += [(first + offset, cmd) for offset, cmd in _logical_lines(block)]
            shell = not fenced and bool(_FENCE.match(line.strip()))
            fenced, block, first = not fenced, [], number
            continue
        if fenced:
            block.append(line.strip())
    return found


def documented_builds() -> list[Documented]:
    """Every `docker build` the Markdown files and the Dockerfiles' usage comments show."""
    found = [
        Documented(f"{doc}:{number}", cmd)
        for doc in DOCS
        if (ROOT / doc).is_file()
        for number, cmd in shell_commands(ROOT / doc)
        if cmd.startswith("docker build")
    ]
    for dockerfile in DOCKERFILES:
        for number, line in enumerate((ROOT / dockerfile).read_text().splitlines(), 1):
            m = re.match(r"^#\s+(docker build .*)$", line)
            if m:
                found.append(Documented(f"{dockerfile}:{number}", m.group(1).strip()))
    return found


def clean_checkout(dest: Path) -> str:
    """The tree as a fresh clone would have it (tracked and new files, nothing ignored, so no
    wheelhouse, no egg-info, no caches), committed in its own repository; returns its commit."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not src.is_file() or src.is_symlink():
            continue  # deleted in the work tree but still in the index
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=hv-tests", "-c", "user.email=hv-tests@localhost"]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clean checkout"]):
        subprocess.run([*git, *argv], cwd=dest, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=dest, capture_output=True, text=True)
    return head.stdout.strip()


def docker_shim(directory: Path, base: str, builder: str) -> Path:
    """`docker` that adds the offline base to `docker build` and passes everything else on."""
    real = shutil.which("docker", path=os.environ.get("PATH", "") + os.pathsep + "/usr/bin")
    assert real, "the docker CLI is not installed (scripts/bootstrap: docker.io)"
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "docker"
    shim.write_text(
        "#!/bin/sh\n"
        "# The offline base, through the documented build arguments only.\n"
        'if [ "$1" = build ]; then\n'
        "  shift\n"
        f'  exec {real} build --build-arg BASE_IMAGE={base} --build-arg BUILD_IMAGE={builder} "$@"\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    shim.chmod(0o755)
    return shim


def argv_of(command: str, env: dict[str, str], cwd: Path) -> list[str]:
    """The words bash makes of a command (variables and substitutions expanded), not run."""
    done = subprocess.run(
        ["bash", "-c", f'set -- {command}\nprintf "%s\\0" "$@"'],
        env=env, cwd=cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.split("\0")[:-1]


def tag_of(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg in ("-t", "--tag"):
            return argv[i + 1]
        if arg.startswith(("-t=", "--tag=")):
            return arg.split("=", 1)[1]
    raise AssertionError(f"no -t in {argv}: an untagged image could not be found again")


@contextlib.contextmanager
def engine_builds() -> Iterator[None]:
    """Builds in the engine, one at a time with `nox -s image` and the image fixtures: their
    clean-up prunes dangling build-stage images, which an unfinished legacy build still needs
    (seen: "failed to get destination image" when both ran at once)."""
    with img._cache_lock(img.CACHE_DIR):
        yield


class Builds:
    """The clean checkout, the shim and the environment the documented commands run in."""

    def __init__(self, tmp: Path, engine: DockerEngine, base: BuiltImage, builder: BuiltImage):
        self.checkout = tmp / "checkout"
        self.checkout.mkdir()
        self.commit = clean_checkout(self.checkout)
        self.shims = tmp / "shims"
        docker_shim(self.shims, base.tag, builder.tag)
        self.engine = engine
        self.tags: set[str] = set()
        self.seconds: dict[str, float] = {}

    def env(self, **extra: str) -> dict[str, str]:
        path = os.pathsep.join([str(self.shims), os.environ.get("PATH", "/usr/bin:/bin")])
        return {"PATH": path, "HOME": str(self.checkout.parent), "LANG": "C.UTF-8",
                "DOCKER_HOST": self.engine.host, **extra}  # fmt: skip

    def run(self, what: str, command: str, **extra: str) -> str:
        """Run one documented command in the checkout; the tag it built."""
        env = self.env(**extra)
        tag = tag_of(argv_of(command, env, self.checkout))
        t0 = time.monotonic()
        with engine_builds():
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.checkout,
                                  env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
        self.seconds[what] = time.monotonic() - t0
        self.tags.add(tag)
        assert done.returncode == 0, (
            f"{what}: {command}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
        return tag


@pytest.fixture(scope="module")
def builds(
    tmp_path_factory: pytest.TempPathFactory,
    engine: DockerEngine,
    client: docker.DockerClient,
    images: ImageSet,
) -> Iterator[Builds]:
    with engine_builds():
        builder = img.build_builder(
            client, images.base, img.wheelhouse(img.CACHE_DIR, print), print
        )
    b = Builds(tmp_path_factory.mktemp("documented"), engine, images.base, builder)
    yield b
    for tag in sorted(b.tags):  # only what these tests tagged; the layers stay cached
        subprocess.run(["docker", "rmi", tag], env=b.env(), capture_output=True, check=False)
    print("image build seconds:", {k: round(v, 1) for k, v in b.seconds.items()})


def version_of(b: Builds, tag: str) -> str:
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
         tag, "--version"],
        env=b.env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout
