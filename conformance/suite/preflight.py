"""pytest glue for preconditions: the target's needs checked once, before the first check.

Loaded by `hvconform.suite.pytest_plugin` (its `pytest_plugins`). The run's controller (or the
single process without xdist) asks the target family's `preflight` module for its requirements
at configure time, before any worker or node exists, and evaluates every one. When one is unmet,
its one line travels to the workers as a field of their start-up input (xdist's `workerinput`,
set in `pytest_configure_node`; never an environment variable), every collected check is skipped
as `environment_blocked: <line>` before its node fixture is set up (so nothing runs and nothing
is reported failed), the line is printed once at the end, and the run exits
EXIT_ENVIRONMENT_BLOCKED. Every finding, met or not, goes to results.json
(`environment.preconditions`).

PYTEST_DONT_REWRITE: no asserts here, and pytest_plugin imports this module before pytest loads
it as a plugin (pytest would warn that it cannot rewrite it).
"""

from __future__ import annotations

from typing import Any

import pytest

from hvconform.contract import runcontext
from hvconform.contract.preconditions import (
    EXIT_ENVIRONMENT_BLOCKED,
    Finding,
    evaluate,
    first_unmet,
)
from hvconform.contract.results import EnvironmentBlocked, Status
from hvconform.suite import outcomes
from hvconform.targets import UnknownTarget, preflight

_FINDINGS: list[Finding] = []  # the controller's, for the environment
_BLOCKED: list[str] = []  # the unmet precondition's line: the controller's verdict, or its copy
WORKER_KEY = "hv_environment_blocked"  # in each xdist worker's workerinput


def blocked_line() -> str:
    """The unmet precondition's line, or '' (in the controller and in every worker)."""
    return _BLOCKED[0] if _BLOCKED else ""


def check(target: str, runtime: str) -> Finding | None:
    """Evaluate the target's preconditions (controller only); the first unmet one, or None."""
    _BLOCKED.clear()  # a previous run in this process decided nothing here
    _FINDINGS.clear()
    try:
        family = preflight(target, runtime)
    except (UnknownTarget, ModuleNotFoundError):
        return None  # no hooks: the target's own setup reports what it lacks
    _FINDINGS.extend(evaluate(family.preconditions(target, runtime)))
    unmet = first_unmet(_FINDINGS)
    if unmet is not None:
        _BLOCKED.append(unmet.line())
    return unmet


def findings() -> list[dict[str, Any]]:
    return [f.to_json() for f in _FINDINGS]


def nothing_created() -> tuple[str, str]:
    """Status and reason of the cleanup check when no node existed."""
    line = blocked_line()
    if line:
        return Status.ENVIRONMENT_BLOCKED.value, line
    return Status.SKIPPED.value, "no ledger entries: no node was created"


@pytest.hookimpl(trylast=True)  # after pytest_plugin's configure made the run directory
def pytest_configure(config: pytest.Config) -> None:
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    if worker is not None:
        _BLOCKED[:] = [worker[WORKER_KEY]] if worker.get(WORKER_KEY) else []
        return
    ctx = runcontext.current()
    check(ctx.target, ctx.runtime)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller, for each worker it starts: the verdict goes with it."""
    node.workerinput[WORKER_KEY] = blocked_line()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    line = blocked_line()
    if not line:
        return
    blocked = EnvironmentBlocked(line)
    mark = pytest.mark.skip(reason=f"{blocked.status.value}: {blocked.reason}")  # the display
    for item in items:
        item.stash[outcomes.STASHED] = blocked  # the status, as a field
        item.add_marker(mark)


@pytest.hookimpl(tryfirst=True)  # before pytest_plugin writes results.json with the exit code
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or not blocked_line():
        return
    if session.exitstatus == pytest.ExitCode.OK:  # every check skipped as blocked: never a pass
        session.exitstatus = EXIT_ENVIRONMENT_BLOCKED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    line = blocked_line()
    if line and not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"hvconform: environment blocked, no check ran: {line}")
