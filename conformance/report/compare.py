"""`hvconform compare A B`: two conformance runs side by side, as a maintainer reviews a change.

A is the baseline, B the candidate (a plugin change, or another plugin). The report lists every
check id of either run with both verdicts and the change called out, every figure with its ratio
B/A, and both environments. Exit 0; with --fail-on-regression, 1 when a check fails in B that did
not fail in A or a duration is slower than the threshold; 2 with one line for unusable input.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hvconform.contract.safewrite import write_atomic
from hvconform.contract.strict_json import one_line
from hvconform.report import compare_model as cm
from hvconform.report import text
from hvconform.report.model import MAX_FIGURES, CheckView, build
from hvconform.report.render import ReportError, environment, load_results

EXIT_REGRESSION = 1
EXIT_BAD_INPUT = 2
MAX_LABEL = 80
PROG = "hvconform compare"


class CompareError(Exception):
    """An input or option that cannot be used; the message is one line."""


def load(arg: str) -> tuple[dict[str, Any], Path]:
    """A results document (every string made visible) and its run directory, from a
    results.json or a run directory holding one; read as strictly as `hvconform report` does."""
    path = Path(arg)
    if path.is_dir():
        path = path / "results.json"
    try:
        data = load_results(path)
    except ReportError as exc:
        raise CompareError(one_line(str(exc))) from None
    return text.visible_tree(data), path.resolve().parent


def _label(given: str | None, data: dict[str, Any], option: str) -> str:
    if given is None:
        return cm.profile_name(data) or str(data["run"]["id"])
    if not given.strip() or len(given) > MAX_LABEL or text.visible(given) != given or "\n" in given:
        raise CompareError(f"{option}: one line of 1 to {MAX_LABEL} printable characters")
    return given.strip()


def _side(label: str, data: dict[str, Any], run_dir: Path, out_dir: Path) -> cm.Side:
    view = build(data, run_dir, out_dir)
    results = Path(os.path.relpath(run_dir / "results.json", out_dir)).as_posix()
    html = run_dir / "report.html"
    report = Path(os.path.relpath(html, out_dir)).as_posix() if html.is_file() else ""
    return cm.Side(label, view, text.href(results), text.href(report) if report else "")


def compare(
    a: tuple[dict[str, Any], Path],
    b: tuple[dict[str, Any], Path],
    out_dir: Path,
    *,
    labels: tuple[str | None, str | None] = (None, None),
    threshold: float = cm.DEFAULT_THRESHOLD,
    floor_s: float = cm.DEFAULT_FLOOR_S,
) -> cm.CompareView:
    """The side-by-side view of two loaded runs, for a report written in out_dir."""
    label_a = _label(labels[0], a[0], "--label-a")
    label_b = _label(labels[1], b[0], "--label-b")
    if label_a == label_b:  # two runs of one plugin: their run ids tell them apart
        label_a = f"{label_a} ({a[0]['run']['id']})" if labels[0] is None else label_a
        label_b = f"{label_b} ({b[0]['run']['id']})" if labels[1] is None else label_b
    if label_a == label_b:
        label_a, label_b = f"A: {label_a}", f"B: {label_b}"
    side_a = _side(label_a, *a, out_dir)
    side_b = _side(label_b, *b, out_dir)
    by_a = {c.id: c for c in side_a.view.checks}
    by_b = {c.id: c for c in side_b.view.checks}
    rows = []
    budget = MAX_FIGURES
    for check_id in cm.merged_ids(list(by_a), list(by_b)):
        ca, cb = by_a.get(check_id), by_b.get(check_id)
        shown, hidden = cm.figures(ca, cb, threshold, floor_s, budget)
        budget -= len(shown)
        why = (_not_judged(a[0], cb), _not_judged(b[0], ca))
        rows.append(cm.Row(check_id, ca, cb, shown, hidden, why))
    env = cm.side_by_side(cm.environment_of(a[0]), cm.environment_of(b[0]))
    return cm.CompareView(side_a, side_b, rows, env, threshold, floor_s)


def _not_judged(results: dict[str, Any], other: CheckView | None) -> str:
    """Why a run has no record of a check the other run has: the check judges an API that
    run's plugin does not speak (a device plugin's run has no DRA check, and the other way)."""
    plugin = (results.get("run") or {}).get("plugin") or {}
    api = plugin.get("api") if isinstance(plugin, dict) else None
    if other is None or not other.apis or not isinstance(api, str) or api in other.apis:
        return ""
    return f"not judged: it judges {' and '.join(other.apis)}, this run's plugin speaks {api}"


def _template(name: str, *, markdown: bool) -> Any:
    """The report's own Jinja environment: in Markdown every {{ }} is escaped unless md, code
    or url made it Markdown already; HTML autoescapes."""
    env = environment(markdown=markdown)
    env.filters.update(kindword=cm.KIND_WORDS.get, statusword=cm.status_word)
    return env.get_template(name)


def render_markdown(view: cm.CompareView) -> str:
    return str(_template("compare.md.j2", markdown=True).render(r=view))


def render_html(view: cm.CompareView) -> str:
    return str(_template("compare.html.j2", markdown=False).render(r=view))


def _write(path: Path, content: str) -> None:
    write_atomic(path, content)


def _number(given: str, option: str, low: float, *, above: bool) -> float:
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (above and value == low) or value > 1e6:
        bound = "above" if above else "at least"
        raise CompareError(f"{option}: a number {bound} {low:g}, got {one_line(given, 40)!r}")
    return value


def _compare(ns: argparse.Namespace) -> cm.CompareView:
    """Validate every option and input, render both formats in memory, and only then write."""
    threshold = _number(ns.threshold, "--threshold", 1.0, above=True)
    floor_s = _number(ns.floor_ms, "--floor-ms", 0.0, above=False) / 1000
    out: Path | None = ns.out
    if out is not None and out.exists() and not out.is_dir():
        raise CompareError(f"--out {one_line(str(out), 160)}: exists and is not a directory")
    a, b = load(ns.a), load(ns.b)
    where = (out or Path.cwd()).resolve()  # links in the report are relative to where it is read
    labels = (ns.label_a, ns.label_b)
    view = compare(a, b, where, labels=labels, threshold=threshold, floor_s=floor_s)
    markdown = render_markdown(view)
    if out is None:
        sys.stdout.write(markdown)
        return view
    html = render_html(view)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(out / "compare.md", markdown)
        _write(out / "compare.html", html)
    except OSError as exc:
        raise CompareError(f"--out {one_line(str(out), 160)}: {exc.strerror or exc}") from None
    print(f"{PROG}: {view.verdict_text}; wrote {out / 'compare.md'} and {out / 'compare.html'}")
    return view


def run(ns: argparse.Namespace) -> int:
    try:
        view = _compare(ns)
    except CompareError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_REGRESSION if ns.fail_on_regression and view.regressed else 0


DESCRIPTION = """\
Compare two conformance runs: A is the baseline (main, or the plugin you trust), B the candidate
(a plugin change, or another plugin). Each input is a results.json or a run directory holding one.

The report lists every check id of either run in catalogue order with both verdicts and the
change called out:
  Regression          B failed and A did not (passed, not applicable, or absent)
  Fixed               A failed and B passed
  No longer verified  A passed and B did not run it to a verdict (not applicable, skipped, ...)
  Now verified        B passed a check A did not verify
  Changed             any other change of verdict (failed -> not applicable, ...)
  Slower              a duration of B (a metric named *_s, such as recovery_s or
                      reregistration_s) is over --threshold times A's AND more than --floor-ms
                      longer: both must hold, so noise on a 1 ms figure is never a regression
                      (other figures, counts, are shown with their ratio but not judged)
Every figure is shown for A and B with the ratio B/A, and both environments side by side.

Without --out the Markdown goes to stdout; with --out DIR, DIR/compare.md and DIR/compare.html
(self-contained: no script, font or image is fetched; readable on a phone and in print).

Exit status: 0; 1 with --fail-on-regression when a check regressed or a figure is slower;
2 with one line on stderr when an input or option cannot be used."""

EPILOG = """\
examples:
  hvconform compare reports/main reports/my-branch
  hvconform compare main/results.json pr/results.json --fail-on-regression
  hvconform compare ours/ go-kvm/ --label-a ours --label-b go-kvm --out reports/compare
  hvconform compare A B --threshold 3 --floor-ms 250  # a busy shared machine

On a quiet machine the defaults hold; on a shared one, timing noise alone moves millisecond
figures several-fold and restart figures by a second between two runs of the same plugin:
loosen both options there, or compare runs made on the same quiet machine."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="baseline: results.json or a run directory")
    parser.add_argument("b", metavar="B", help="candidate: results.json or a run directory")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write DIR/compare.md and DIR/compare.html (default: Markdown to stdout)",
    )
    parser.add_argument(
        "--label-a",
        default=None,
        metavar="TEXT",
        help="name of A in the report (default: its plugin profile's name, else its run id)",
    )
    parser.add_argument(
        "--label-b",
        default=None,
        metavar="TEXT",
        help="name of B in the report (default: as for A)",
    )
    parser.add_argument(
        "--threshold",
        default=str(cm.DEFAULT_THRESHOLD),
        metavar="RATIO",
        help="a duration is slower when B/A exceeds RATIO (above 1; default %(default)s) ...",
    )
    parser.add_argument(
        "--floor-ms",
        default=str(cm.DEFAULT_FLOOR_S * 1000),
        metavar="MS",
        help="... and B exceeds A by more than MS milliseconds (default %(default)s)",
    )
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a check regressed or a figure is slower",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `compare` subcommand; its func is run."""
    parser = subparsers.add_parser(
        "compare",
        help="compare two runs side by side (verdicts, figures with ratios, environments)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(list(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
