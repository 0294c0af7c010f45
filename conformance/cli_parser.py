"""hvconform's command line: every subcommand's options and help, in one place.

`run` is defined here with its runner passed in (hvconform.cli.cmd_run); each other subcommand
lives in its own module and adds itself (see `_subcommands`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping

from hvconform import cli_inputs as inputs
from hvconform.contract.runcontext import MODES
from hvconform.scenarios import CATALOGUE, CLEANUP
from hvconform.targets import TARGETS, add_options


class _RunHelp(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults shown, and the checks' list (the epilog) kept as written."""


def build_parser(
    cmd_run: Callable[[argparse.Namespace], int], env: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """hvconform's parser; `cmd_run` runs `hvconform run` (hvconform.cli). `env`: where flags
    read their defaults (the process's environment, read here once)."""
    env = os.environ if env is None else env
    # Each check with its marker, the APIs it judges and its requirement level (MUST: the
    # kubelet's contract; SHOULD: a practice, its failure shown apart in the report).
    checks = "\n".join(
        f"  {c.id:<33} -m {c.marker:<13} {'+'.join(c.apis):<17} {c.requirement_level or '-':<6} "
        f"{c.title}"
        for c in (*CATALOGUE, CLEANUP)
    )
    parser: argparse.ArgumentParser = inputs.OneLineParser(
        prog="hvconform",
        description="Conformance suite for Kubernetes hypervisor device plugins (v1beta1) and "
        "DRA drivers: each check judges the API it names (deviceplugin, dra or both).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"checks:\n{checks}\n\nexamples:\n  hvconform run\n  hvconform run -m cdi -n 2\n"
        "  hvconform run --plugin-cmd 'python -m my_plugin --flag'\n"
        "  hvconform run --target node --plugin-profile conformance/profiles/hv-dra-driver.yaml\n",
    )
    parser.add_argument("--version", action=inputs.VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for register in _subcommands():
        register(sub)
    run = sub.add_parser(
        "run",
        help="run the suite; exit 1 when any check failed",
        formatter_class=_RunHelp,
        epilog=f"checks (id, marker, API, level, title):\n{checks}\n",
    )
    run.add_argument(
        "--target",
        choices=tuple(TARGETS),
        default=next(iter(TARGETS)),  # the registry's first: this machine, no cluster
        help="; ".join(f"{name}: {t.about}" for name, t in TARGETS.items()),
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the target's complete plan (what it would start, create and remove) and "
        "exit; executes nothing",
    )
    run.add_argument(
        "--image",
        default=env.get("HV_IMAGE", ""),
        type=inputs.image_arg(pinned=True, env="HV_IMAGE", environ=env),
        help="where the plugin runs from its image (--runtime container, the cluster "
        "targets): override the profile's deploy.image (a fixed tag, never :latest, or a "
        "digest) [HV_IMAGE]",
    )
    run.add_argument(
        "-m",
        dest="markexpr",
        default="",
        help="pytest marker expression choosing checks (e.g. 'cdi or identity')",
    )
    run.add_argument(
        "--mode",
        choices=MODES,
        default="full",
        help="full: the whole catalogue, faults included, on a node the run may disturb; "
        "validate: only the checks that disturb nothing on a serving node (the catalogue's "
        "validate column: no fault, nothing of the plugin's written, one free slot taken for "
        "one guest and given back)",
    )
    run.add_argument("--out", default="", help="results dir (default reports/<run-id>)")
    run.add_argument(
        "--plugin-profile",
        default=env.get("HV_PLUGIN_PROFILE", ""),
        metavar="FILE",
        help="YAML profile of the plugin under test: command (run as is), env, paths, "
        "readiness/liveness probes; see README 'Testing your own plugin' [HV_PLUGIN_PROFILE] "
        "(default: this repository's shipped profile)",
    )
    run.add_argument(
        "--plugin-cmd",
        default=env.get("HV_PLUGIN_CMD", ""),
        help="shortcut for a plugin with this repository's flags: the standard paths are "
        "passed as --device-plugin-dir/--cdi-dir/--host-dev-dir/--health-addr [HV_PLUGIN_CMD]",
    )
    run.add_argument(
        "-n",
        dest="workers",
        default="0",
        help="pytest-xdist workers ('auto' or a number; 0 = serial)",
    )
    run.add_argument(
        "--recovery-timeout",
        type=float,
        default=60.0,
        help="seconds a plugin may take to detect a fault or recover from it",
    )
    run.add_argument("--reports-root", default="reports", help="where reports/<run-id> live")
    run.add_argument("pytest_args", nargs="*", help="extra pytest arguments after --")
    # each target's own flags, in a group per target (the registry asks each family)
    add_options(run, env)
    run.set_defaults(func=cmd_run)
    return parser


Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _subcommands() -> list[Register]:
    """Each further subcommand lives in its own module and adds itself (func = its runner)."""
    from hvconform.bench.cli import register as bench_register
    from hvconform.fleet.cli import register as fleet_register
    from hvconform.manifests.cli import register as manifests_register
    from hvconform.metadata.cli import register as metadata_register
    from hvconform.profile_tool.cli import register as profile_register
    from hvconform.report.cli import register as report_register
    from hvconform.report.compare import register as compare_register
    from hvconform.sonobuoy.node import register as sonobuoy_node_register
    from hvconform.sonobuoy.plugin import register as sonobuoy_plugin_register
    from hvconform.targets.cluster.sweep import register as cleanup_register

    registers: list[Register] = [
        manifests_register,
        metadata_register,
        report_register,
        compare_register,
        fleet_register,
        sonobuoy_plugin_register,
        sonobuoy_node_register,
        bench_register,
        cleanup_register,
        profile_register,
    ]
    return registers
