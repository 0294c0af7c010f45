"""hvconform: run the conformance suite against a node target and keep its results."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hvconform import cli_inputs as inputs
from hvconform import cluster_nodes
from hvconform.cli_parser import build_parser
from hvconform.contract import manifest, settings
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.errors import Unhonoured
from hvconform.contract.plugin import ProfileError
from hvconform.contract.plugin import resolve as resolve_plugin
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.runcontext import ENV_CONTEXT, RunContext, TargetOptions
from hvconform.scenarios import CATALOGUE, CLEANUP, VALIDATE_MARK
from hvconform.targets import (
    TARGETS,
    OptionInputs,
    announce,
    foreign_flags,
    plan_text,
    target_options,
)
from hvconform.targets.honour import refusal

SUITE_DIR = Path(__file__).resolve().parent / "suite"
EXIT_NO_CHECKS = inputs.EXIT_NO_CHECKS


def _unknown_markers(markexpr: str) -> list[str]:
    known = {c.marker for c in (*CATALOGUE, CLEANUP)}
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_-]*", markexpr)
    return sorted({w for w in words if w not in ("and", "or", "not") and w not in known})


def _link_latest(root: Path, out: Path) -> None:
    latest = root / "latest"
    tmp = root / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(out, root))
    tmp.replace(latest)


def _render_reports(results: Path, out: Path, *, partial: bool) -> None:
    """Reports are written for every run, failed or interrupted ones included."""
    from hvconform.report import ReportError, append_step_summary, render_all

    try:
        paths = render_all(results, out, partial=partial)
        append_step_summary(paths["markdown"])
    except ReportError as exc:
        print(f"hvconform: could not render reports: {exc}", file=sys.stderr)
        return
    print(f"hvconform: report at {paths['markdown']} and {paths['html']}")


def _target_options(
    ns: argparse.Namespace, inputs_: OptionInputs
) -> tuple[TargetOptions | None, int | None]:
    """The chosen target's typed options, built and checked by the target; the plan printed
    for --dry-run. Returns (options, exit code)."""
    foreign = foreign_flags(ns.target, ns)
    if foreign:
        print(f"hvconform: {', '.join(foreign)}: not an option of --target {ns.target} (see "
              "hvconform run --help: each target's options are grouped under it)",
              file=sys.stderr)  # fmt: skip
        return None, 2
    try:
        options: TargetOptions = target_options(ns.target, ns, inputs_)
        if TARGETS[ns.target].pool and isinstance(options, ClusterOptions) and not ns.dry_run:
            options = cluster_nodes.resolve(options)  # --all-nodes: the nodes, by name
    except ValueError as exc:
        print(f"hvconform: {exc}", file=sys.stderr)
        return None, 2
    if ns.dry_run:
        print(plan_text(ns.target, options, inputs_.plugin), end="")
        return None, 0
    if not TARGETS[ns.target].cluster:
        return options, None
    try:
        plan = plan_text(ns.target, options, inputs_.plugin)  # renders and gates: refusals first
    except EnvironmentBlocked:
        plan = ""  # helm missing, say: the suite's preflight reports it with its fix
    hint = next((line for line in plan.splitlines() if "if the run is killed" in line), "")
    if hint:
        print(f"hvconform: {hint.lstrip('# ')}", flush=True)
    said = announce(ns.target, options)
    if said:
        print(f"hvconform: {said}", flush=True)
    return options, None


def _input_problem(ns: argparse.Namespace) -> str | None:
    """The first of the run's own inputs that cannot be used (exit 2 before anything exists)."""
    return (
        (inputs.markexpr_problem(ns.markexpr) if ns.markexpr else None)
        or inputs.recovery_problem(ns.recovery_timeout)
        or inputs.workers_problem(str(ns.workers))
    )


def _output_problem(ns: argparse.Namespace, root: Path, out: Path) -> str | None:
    """--out new or empty, --reports-root a directory (when used), reports/latest a symlink."""
    uses_root = not ns.out or out.parent == root
    return (
        inputs.output_problem("--out", out, must_be_empty=True)
        or (
            inputs.output_problem("--reports-root", root, must_be_empty=False)
            if uses_root
            else None
        )
        or (inputs.latest_problem(root) if uses_root else None)
    )


def _load_run_results(results: Path) -> dict[str, Any] | None:
    from hvconform.report import ReportError, load_results

    try:
        return load_results(results)
    except ReportError as exc:
        print(f"hvconform: the run's own results are unusable: {exc}", file=sys.stderr)
        return None


def _selection(mode: str, markexpr: str) -> str:
    """The marker expression pytest selects with: the user's, within the validate subset in
    validate mode (the catalogue rows' own field, carried as their mark)."""
    if mode != "validate":
        return markexpr
    return f"{VALIDATE_MARK} and ({markexpr})" if markexpr else VALIDATE_MARK


def cmd_run(ns: argparse.Namespace) -> int:
    problem = _input_problem(ns)
    if problem:
        print(f"hvconform: {problem}", file=sys.stderr)
        return inputs.EXIT_BAD_INPUT
    unknown = _unknown_markers(ns.markexpr)
    if unknown:
        known = sorted({c.marker for c in (*CATALOGUE, CLEANUP)})
        print(
            f"hvconform: unknown marker(s) in -m: {', '.join(unknown)}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    try:
        plugin = resolve_plugin(ns.plugin_profile, ns.plugin_cmd)
    except ProfileError as exc:
        print(f"hvconform: {exc}", file=sys.stderr)
        return 2
    why = refusal(plugin, ns.target, ns.runtime, image=ns.image)
    if why:
        print(f"hvconform: {why}", file=sys.stderr)
        return inputs.EXIT_BAD_INPUT
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
    root = Path(ns.reports_root).resolve()
    out = Path(ns.out).resolve() if ns.out else root / run_id
    try:
        options, code = _target_options(ns, OptionInputs(run_id, out, plugin))
    except EnvironmentBlocked as exc:  # helm missing, say: the fix, not a check failure
        print(f"hvconform: environment blocked: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT_BLOCKED
    except (Unhonoured, ValueError) as exc:  # the profile's objects cannot be rendered
        print(f"hvconform: {str(exc).splitlines()[0][:300]}", file=sys.stderr)
        return inputs.EXIT_BAD_INPUT
    if options is None:  # refused, or --dry-run printed its plan
        return inputs.EXIT_BAD_INPUT if code is None else code
    cluster = options if isinstance(options, ClusterOptions) else None
    if TARGETS[ns.target].serial:
        ns.workers = "0"  # a cluster per run, one real node per machine
    problem = _output_problem(ns, root, out)
    if problem:
        print(f"hvconform: {problem}", file=sys.stderr)
        return inputs.EXIT_BAD_INPUT
    out.mkdir(parents=True, exist_ok=True)
    if ns.image and cluster is None and plugin.deploy is not None:
        plugin = plugin.with_image(ns.image)  # the documented override, on every target
    ctx = RunContext(
        run_id=run_id,
        out_dir=str(out),
        target=ns.target,
        plugin=plugin if cluster is None else plugin.with_image(cluster.image),
        recovery_timeout_s=ns.recovery_timeout,
        markexpr=ns.markexpr,
        workers=str(ns.workers),
        mode=ns.mode,
        # the target's own options, typed: read from its flags (or their environment
        # variables) here, once; the target reads them from the context
        options=options,
        settings=settings.current(),
    )
    context_path = ctx.write()
    args = [
        sys.executable,
        "-m",
        "pytest",
        str(SUITE_DIR),
        "-c",
        str(SUITE_DIR / "pytest.ini"),
        "--rootdir",
        str(SUITE_DIR),
        "-p",
        "hvconform.suite.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "--context",
        str(context_path),
        "-q",
        "-rfEs",  # failures, errors and skips summarised; passes are the progress lines already
    ]
    print(f"hvconform: plugin under test: {plugin.name} ({plugin.source})", flush=True)
    if selection := _selection(ns.mode, ns.markexpr):
        args += ["-m", selection]
    if ns.workers not in ("", "0"):
        args += ["-n", ns.workers, "--dist", "loadfile"]
    args += ns.pytest_args
    print(f"hvconform: run {run_id} on target {ns.target}; results in {out}", flush=True)
    # gRPC core's INFO lines (fork_posix "skipping fork() handlers") are noise on the console.
    env = {"GRPC_VERBOSITY": "ERROR", **os.environ, ENV_CONTEXT: str(context_path)}
    if cluster is not None and TARGETS[ns.target].pool and len(cluster.nodes) > 1:
        # a node pool: one suite process per node at once, the plugin deployed once for all
        return cluster_nodes.run(
            ctx, args, env, lambda d: _render_reports(d / "results.json", d, partial=False)
        )
    code = inputs.run_pytest(args, env)
    # The run started from a new or empty --out: all it holds now, the run wrote.
    manifest.write(out, manifest.inventory(out))
    results = out / "results.json"
    if code == EXIT_NO_CHECKS:
        print(
            f"hvconform: no checks selected (-m {ns.markexpr!r}); nothing was verified",
            file=sys.stderr,
        )
        return EXIT_NO_CHECKS
    if not results.exists():
        print(f"hvconform: pytest exited {code} without writing {results}", file=sys.stderr)
        return inputs.exit_without_results(code)
    if ns.out == "" or out.parent == root:
        _link_latest(root, out)
    data = _load_run_results(results)
    if data is None:
        return inputs.EXIT_SUITE_BROKE
    _render_reports(results, out, partial=bool(data["run"].get("partial")))
    counts = data["run"].get("counts", {})
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no check results"
    print(f"hvconform: {summary}; results.json at {results}")
    # blocked: a check that could not run on a node left dirty or never up verified nothing, so
    # the run did not pass either (environment_blocked runs exit 6 through the preflight)
    failed = any(c["status"] in ("failed", "blocked") for c in data["checks"])
    return inputs.exit_code(code, failed=failed)


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser(cmd_run).parse_args(list(sys.argv[1:] if argv is None else argv))
    # What the user set by environment variable, read here once: every later reader of this
    # process, and every process of a run (through the run context), reads these fields.
    settings.install(settings.RunSettings.from_env())
    try:
        code: int = ns.func(ns)
        sys.stdout.flush()  # here, not at the interpreter's exit, where it could not be caught
    except BrokenPipeError:
        # `hvconform profile check P | head`: the reader left; what it took was the point.
        # stdout is pointed at /dev/null so the interpreter's own final flush cannot raise too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
