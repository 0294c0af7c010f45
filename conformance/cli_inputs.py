"""hvconform's input rules: every bad value is exit 2 with one line, before anything is written.

Kept apart from hvconform.cli so the rules (and the exit codes README lists) have one home:

  0   every selected check passed (report: and the run was complete)
  1   a check failed or was blocked; report: failed or partial; metadata: rejected;
      manifests --check: a policy violation; bench: a correctness figure missed or a step
      broke; compare: a regression
  2   unusable input, refused with one line before anything is written: options, a marker
      expression that does not parse, output paths that are files or not empty, results or
      snapshots that are not what they claim (binary, deep, NaN), pytest arguments after --
  3   the suite itself broke: pytest's internal error, or the run's own results unreadable
  5   no check matched -m: nothing was verified
  6   environment blocked: a precondition of the target is unmet (one line names the
      component, the version found and needed, and the fix); no check ran
  130 interrupted (Ctrl-C, or pytest stopped the session early, e.g. a collection error): the
      partial results are still reported
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

# Re-exported: hvconform's CLI reads every rule and code from here.
from hvconform.contract.args import EXIT_BAD_INPUT as EXIT_BAD_INPUT
from hvconform.contract.args import OneLineParser as OneLineParser
from hvconform.contract.args import docker_host_arg as docker_host_arg
from hvconform.contract.args import image_arg as image_arg
from hvconform.contract.args import output_problem as output_problem
from hvconform.contract.args import values_file_arg as values_file_arg
from hvconform.contract.args import values_key_arg as values_key_arg
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED

EXIT_OK, EXIT_FAILED, EXIT_SUITE_BROKE = 0, 1, 3
EXIT_NO_CHECKS, EXIT_INTERRUPTED = 5, 130
# pytest's own exit codes (pytest.ExitCode), mapped onto the table above.
_PYTEST = {0: EXIT_OK, 1: EXIT_FAILED, 2: EXIT_INTERRUPTED, 3: EXIT_SUITE_BROKE, 4: EXIT_BAD_INPUT}
_PYTEST[EXIT_ENVIRONMENT_BLOCKED] = EXIT_ENVIRONMENT_BLOCKED  # the suite's own (preflight)
MAX_RECOVERY_S = 3600.0  # an hour: longer than any recovery worth waiting for on a node
MAX_WORKERS = 256


class VersionAction(argparse.Action):
    """--version: the installed version and the source commit, computed only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print version and commit, exit 0")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        from hv_device_plugin.api.names import installed_version
        from hvconform.contract import buildinfo
        from hvconform.suite.environment import source_commit

        try:
            info = buildinfo.current()
        except buildinfo.BuildInfoError as exc:
            parser.exit(EXIT_BAD_INPUT, f"{parser.prog}: {exc}\n")
        # In the suite's image: the commit it was built from and its pinned tools, one a line.
        commit = info.commit if info is not None else source_commit()
        print(f"{parser.prog} {installed_version()} (commit {commit})")
        for line in info.lines() if info is not None else []:
            print(line)
        parser.exit(EXIT_OK)


def markexpr_problem(markexpr: str) -> str | None:
    """Why pytest would refuse the -m expression, in pytest's own words, or None."""
    from _pytest.mark.expression import Expression

    try:
        Expression.compile(markexpr)
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        return f"-m {markexpr!r}: not a marker expression{where}: {exc.msg}"
    return None


def recovery_problem(seconds: float) -> str | None:
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_RECOVERY_S:
        return f"--recovery-timeout {seconds!r}: a number of seconds above 0, at most {MAX_RECOVERY_S:g}"
    return None


def workers_problem(workers: str) -> str | None:
    if workers in ("auto", "logical") or (workers.isdecimal() and int(workers) <= MAX_WORKERS):
        return None
    return f"-n {workers!r}: 'auto', 'logical' or a number of workers 0..{MAX_WORKERS}"


def latest_problem(root: Path) -> str | None:
    """reports/latest is replaced atomically: it must be a symlink when it exists."""
    latest = root / "latest"
    if os.path.lexists(latest) and not latest.is_symlink():
        return f"--reports-root {root}: {latest} exists and is not a symlink"
    return None


def run_pytest(args: list[str], env: dict[str, str]) -> int:
    """pytest's exit code. Ctrl-C reaches pytest too (same process group): it stops the run and
    writes partial results, so hvconform keeps waiting for it instead of dying with a trace."""
    child = subprocess.Popen(args, env=env)
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            print(
                "hvconform: interrupted; waiting for pytest to write partial results",
                file=sys.stderr,
            )


def exit_code(pytest_code: int, *, failed: bool) -> int:
    """The run's exit code (table above) from pytest's and whether a check failed."""
    if failed:
        return EXIT_FAILED
    return _PYTEST.get(pytest_code, EXIT_SUITE_BROKE)


def exit_without_results(pytest_code: int) -> int:
    """pytest stopped before results.json existed: its usage error (4) is bad input (pytest
    arguments after --); anything else means the suite broke before it could report."""
    return EXIT_BAD_INPUT if _PYTEST.get(pytest_code) == EXIT_BAD_INPUT else EXIT_SUITE_BROKE
