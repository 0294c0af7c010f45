"""`hvconform fleet-report PATH...`: a node pool's per-node results merged into one report.

Every input and option is checked and every node's results read and merged in memory before
anything is written; then --out DIR (default ./fleet-report, never through a symlink) gets
fleet.json, fleet.txt and fleet.html, and the text summary goes to stdout. Exit 0 when the pool
passed, 1 when it failed or is incomplete, 2 with one line on stderr for unusable input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hvconform.contract.args import OneLineParser, output_problem
from hvconform.contract.safewrite import write_atomic
from hvconform.contract.strict_json import one_line

EXIT_PASSED = 0
EXIT_NOT_PASSED = 1
EXIT_BAD_INPUT = 2
PROG = "hvconform fleet-report"
MAX_EXPECTED = 5000
MAX_NODE_NAME = 253
FILES = ("fleet.json", "fleet.txt", "fleet.html")


class _BadInput(Exception):
    """An option that cannot be used; the message is one line."""


def _expected_names(given: str | None) -> tuple[str, ...]:
    if given is None:
        return ()
    names = tuple(n.strip() for n in given.split(","))
    bad = next((n for n in names if not n or len(n) > MAX_NODE_NAME or not n.isprintable()), None)
    if bad is not None:
        raise _BadInput(
            f"--nodes: node names of 1 to {MAX_NODE_NAME} printable characters, comma-separated;"
            f" got {one_line(bad, 60)!r}"
        )
    if len(set(names)) != len(names):
        raise _BadInput("--nodes: a node is named twice")
    if len(names) > MAX_EXPECTED:
        raise _BadInput(f"--nodes: more than {MAX_EXPECTED} names")
    return names


def _expected_count(given: str | None) -> int | None:
    if given is None:
        return None
    if not given.isdecimal() or not 1 <= int(given) <= MAX_EXPECTED:
        raise _BadInput(f"--expect-nodes: a number of nodes 1..{MAX_EXPECTED}, got {given!r}")
    return int(given)


def _out_problem(out: Path) -> str | None:
    if out.is_symlink():
        return f"--out {out}: a symlink; give the directory itself"
    return output_problem("--out", out, must_be_empty=False)


def _run(ns: argparse.Namespace) -> int:
    # Imported here so `hvconform --help` does not load jinja2 and jsonschema.
    from hvconform.fleet import model, render

    names = _expected_names(ns.nodes)
    count = _expected_count(ns.expect_nodes)
    out: Path = ns.out
    problem = _out_problem(out)
    if problem:
        raise _BadInput(problem)
    nodes = model.load([Path(p) for p in ns.paths], out.resolve())
    fleet = model.merge(nodes, expect_count=count, expect_names=names)
    outputs = {
        "fleet.json": render.render_json(fleet),
        "fleet.txt": render.render_text(fleet),
        "fleet.html": render.render_html(fleet),
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, content in outputs.items():
            write_atomic(out / name, content)
    except OSError as exc:
        raise _BadInput(f"--out {out}: {exc.strerror or exc}") from None
    sys.stdout.write(outputs["fleet.txt"])
    print(f"{PROG}: wrote {', '.join(str(out / n) for n in FILES)}")
    return EXIT_PASSED if fleet.verdict == "passed" else EXIT_NOT_PASSED


def run(ns: argparse.Namespace) -> int:
    from hvconform.fleet.sources import FleetError

    try:
        return _run(ns)
    except (_BadInput, FleetError) as exc:
        print(f"{PROG}: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT


DESCRIPTION = """\
Merge the suite's per-node results of a node pool into one report: each check's verdict on
each node, each figure's distribution across the nodes (min, median, p95 by nearest rank, max)
with the outlying nodes named, the nodes whose environment differs (kernel, container runtime,
kubelet, OS image, hypervisor device metadata), and one verdict for the pool.

Each PATH is a directory (searched for results.json files: `hvconform run --target cluster
--nodes a,b --out DIR` leaves DIR/<node>/results.json), a results.json, or a Sonobuoy results
tarball (`sonobuoy retrieve`; plugins/<plugin>/results/<node>/..., nested results.tar.gz or
out.tar.gz read too; read in memory, never extracted). A node is named by its results'
environment (environment.cluster.node), else by its Sonobuoy node directory, else by the host
name, and the report says which; two results of one node are refused.

Pool verdict: failed when any node failed any check; incomplete when none failed but a check
was blocked, environment blocked, not run or absent on a node, a run was partial, a node passed
nothing, or an expected node (--nodes, --expect-nodes) has no results; passed otherwise. Not
applicable and skipped checks are listed and never count as passed.

Outlier: |value - median| > 3 x max(1.4826 x MAD, 5% of |median|, 1e-6), among 3 or more nodes.

Exit status: 0 passed; 1 failed or incomplete; 2 with one line on stderr when an input or
option cannot be used (nothing is written then)."""

EPILOG = """\
examples:
  hvconform fleet-report reports/pool --nodes node-a,node-b,node-c
  hvconform fleet-report sonobuoy_202601011200.tar.gz --expect-nodes 12 --out fleet"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a directory holding results.json files, a results.json, or a Sonobuoy tarball",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("fleet-report"),
        metavar="DIR",
        help="write DIR/fleet.json, DIR/fleet.txt and DIR/fleet.html (default: %(default)s)",
    )
    parser.add_argument(
        "--nodes",
        default=None,
        metavar="A,B,...",
        help="the nodes the pool has: one without results makes the pool incomplete",
    )
    parser.add_argument(
        "--expect-nodes",
        default=None,
        metavar="N",
        help="how many nodes the pool has: fewer results make the pool incomplete",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `fleet-report` subcommand; its func is run."""
    parser = subparsers.add_parser(
        "fleet-report",
        help="merge per-node results into one pool report (verdicts, figures, environments)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(list(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
