"""`hvconform profile init` and `hvconform profile check`: the subcommand and its two runners.

Exit codes: 0 done (`check`: the profile loads; what a target refuses is printed); 2 bad
input (one line, never a traceback: a file that is not objects, no plugin DaemonSet, a value no
profile may hold, an output that exists without --force); 6 helm is missing to render a chart.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hvconform.contract.args import EXIT_BAD_INPUT
from hvconform.contract.errors import ProfileError
from hvconform.contract.plugin import load_profile, parse_profile
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED
from hvconform.contract.safewrite import write_atomic
from hvconform.contract.safeyaml import (
    MAX_FILE_BYTES,
    Budget,
    UnsafeInput,
    excerpt,
    load_strict,
    read_bounded,
)
from hvconform.contract.strict_json import one_line
from hvconform.profile_tool.daemonset import StarterError, facts
from hvconform.profile_tool.writer import Source, render

# The namespace a chart is rendered into to read it (a run renders it into its own).
RENDER_NAMESPACE = "hvconform"
_EXAMPLES = """examples:
  hvconform profile init --from-manifest deploy/daemonset.yaml -o profile.yaml
  hvconform profile init --from-chart charts/my-plugin --resource example.com/kvm
  hvconform profile check profile.yaml
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `profile` with its `init` and `check` actions."""
    parser = sub.add_parser(
        "profile",
        help="start a plugin profile from its DaemonSet or chart; check what each target runs",
        description="A plugin profile (README: Testing your own plugin) in minutes: `init` "
        "writes one from the plugin's own objects, `check` validates one and prints what each "
        "target would run and observe, and what it refuses.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EXAMPLES,
    )
    actions = parser.add_subparsers(dest="profile_command", required=True)
    init = actions.add_parser(
        "init",
        help="write a commented profile from a DaemonSet manifest or a Helm chart",
        description="Read the plugin's DaemonSet (its image, hostPath volumes of the kubelet "
        "socket dir, the CDI dir and /dev/kvm or /dev/mshv, probes, pod labels, container) and "
        "write a profile whose comments mark each value read or GUESSED. The profile is loaded "
        "back with the run's own rules before it is written. Exit 2 for unusable input.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EXAMPLES,
    )
    source = init.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-manifest", metavar="FILE", default="",
                        help="a YAML file (several documents allowed) holding the DaemonSet")  # fmt: skip
    source.add_argument("--from-chart", metavar="DIR", default="",
                        help="a Helm chart directory, rendered with its defaults by helm")  # fmt: skip
    init.add_argument("-o", "--output", metavar="FILE", default="",
                      help="write the profile here (atomically) instead of stdout")  # fmt: skip
    init.add_argument("--force", action="store_true", help="replace an existing --output")
    init.add_argument("--daemonset", default="", metavar="NAME",
                      help="the plugin's DaemonSet when the objects hold several")  # fmt: skip
    init.add_argument("--container", default="", metavar="NAME",
                      help="the plugin's container when its pods have several")  # fmt: skip
    init.add_argument("--image", default="", metavar="REF",
                      help="deploy.image instead of the container's (a fixed tag or a digest)")  # fmt: skip
    init.add_argument("--resource", default="", metavar="NAME",
                      help="the extended resource it advertises (kind, aks, cluster need it)")  # fmt: skip
    init.set_defaults(func=cmd_init)
    check = actions.add_parser(
        "check",
        help="validate a profile and print, per target, what it runs and observes",
        description="Load a profile with the run's own rules and print, for each target (local,"
        " local --runtime container, node, cluster, kind, aks), the command or image and "
        "objects it would run, how readiness and liveness are observed there, or why it "
        "refuses. Renders charts, creates nothing. Exit 0 when the profile loads (refusals "
        "are printed), 2 when it does not.",
    )
    check.add_argument("profile", metavar="P", help="a plugin profile (YAML)")
    check.set_defaults(func=cmd_check)


def _objects(ns: argparse.Namespace) -> tuple[list[dict[str, object]], str, Path]:
    """The objects the user named, where they came from (for messages), and that path."""
    from hvconform.manifests.chart import ObjectError, load_objects, template

    if ns.from_manifest:
        path = Path(ns.from_manifest)
        where = excerpt(str(path), 120)
        try:
            # not followed: a run reads the profile's manifests the same way (manifests.profile)
            data = read_bounded(path, MAX_FILE_BYTES, follow=False)
            return load_objects(data, where, Budget()), where, path
        except (UnsafeInput, ObjectError) as exc:
            raise StarterError(str(exc)) from None
    path = Path(ns.from_chart)
    where = f"chart {excerpt(str(path), 120)}"
    if not (path / "Chart.yaml").is_file():
        raise StarterError(f"{where}: not a Helm chart directory (no Chart.yaml)")
    try:
        text = template(RENDER_NAMESPACE, chart=path)  # HelmMissing is the caller's
        return load_objects(text, f"helm template {where}", Budget()), where, path
    except ObjectError as exc:
        raise StarterError(str(exc)) from None


def _output(ns: argparse.Namespace) -> Path | None:
    if not ns.output:
        return None
    out = Path(ns.output)
    if os.path.lexists(out) and (out.is_dir() or not ns.force):
        why = "a directory" if out.is_dir() else "exists (--force replaces it)"
        raise StarterError(f"-o {excerpt(str(out), 120)}: {why}")
    if not out.parent.resolve().is_dir():
        raise StarterError(f"-o {excerpt(str(out), 120)}: its directory does not exist")
    return out


def _init(ns: argparse.Namespace) -> tuple[str, Path | None]:
    out = _output(ns)
    objects, where, path = _objects(ns)
    found = facts(objects, where, daemonset=ns.daemonset, container=ns.container, image=ns.image)
    base = out.parent.resolve() if out is not None else Path.cwd()
    # Relative to the profile so the pair can move together; absolute on stdout (no home yet).
    named = os.path.relpath(path.resolve(), base) if out is not None else str(path.resolve())
    source = Source("manifest" if ns.from_manifest else "chart", named, str(path))
    text = render(found, source, resource=ns.resource)
    shown = excerpt(str(out), 120) if out is not None else "<stdout>"
    try:
        parse_profile(load_strict(text.encode("utf-8"), shown), shown, base)
    except (UnsafeInput, ProfileError) as exc:
        raise StarterError(f"the profile made from {where} does not load: {exc}") from None
    return text, out


def cmd_init(ns: argparse.Namespace) -> int:
    from hvconform.manifests.chart import ChartError, HelmMissing

    try:
        text, out = _init(ns)
    except HelmMissing as exc:
        print(f"hvconform profile init: environment blocked: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_ENVIRONMENT_BLOCKED
    except (StarterError, ChartError) as exc:
        print(f"hvconform profile init: {one_line(str(exc), 400)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if out is None:
        sys.stdout.write(text)
        return 0
    write_atomic(out, text)
    shown = one_line(str(out), 200)
    print(f"hvconform profile init: wrote {shown}; next: hvconform profile check {shown}")
    return 0


def cmd_check(ns: argparse.Namespace) -> int:
    from hvconform.profile_tool.explain import describe  # the targets' modules: only here

    try:
        plugin = load_profile(ns.profile)
    except ProfileError as exc:
        print(f"hvconform profile check: {one_line(str(exc), 400)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(describe(plugin)))
    return 0
