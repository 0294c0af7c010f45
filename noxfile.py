"""Developer and CI entry points: `nox -l` lists them."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PYTHON = os.environ.get("HV_NOX_PYTHON", "3.11")
PACKAGES = ["plugin", "conformance", "tests", "tools", "noxfile.py"]


def _pytest(session: nox.Session, *args: str) -> None:
    # pytest exit 5 means "no tests collected": a wrong selection, never a pass.
    code = session.run("pytest", *args, success_codes=[0, 1, 2, 3, 4, 5], silent=False)
    if code == 5:
        session.error("pytest collected no tests (exit 5): the selection matched nothing")
    if code not in (0, True, None):
        session.error(f"pytest failed with exit code {code}")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and the import contracts."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", *PACKAGES)
    session.run("ruff", "format", "--check", *PACKAGES)
    session.run("lint-imports")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on plugin/ and conformance/."""
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit and integration tests: real /dev/kvm, sockets, mounts, containers (needs root)."""
    session.install("-e", ".[dev]")
    _pytest(
        session,
        "-n",
        os.environ.get("HV_TEST_WORKERS", "auto"),
        "--dist",
        "loadfile",
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
    session.install("grpcio-tools>=1.66", "mypy-protobuf>=3.6")
    session.run("python", "tools/gen_protos.py")


@nox.session(python=PYTHON)
def image(session: nox.Session) -> None:
    """Plugin and workload images with no registry (debootstrap base, offline build), timed.

    `nox -s image -- --base-image python:3.11-slim` uses a registry base already pulled.
    """
    session.install("-e", ".[conformance]")
    session.run("python", "-m", "conformance.images", *session.posargs)
