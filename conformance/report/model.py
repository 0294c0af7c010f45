"""The report's view of a results.json: every sentence and row the templates show, computed once.

Markdown, HTML and JUnit all read this model, so the three can never disagree about a verdict.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvconform.contract import manifest
from hvconform.report import env_facts, legacy, plugin_facts, text, words

LEDGER_MAX_BYTES = 16 * 1024 * 1024  # per ledger file read for the cleanup summary
# What a report or a comparison shows is bounded and stated: a check shows at most this many
# figures (a real check records a dozen) and timeline events (a fault check records a few), a
# whole report or comparison at most MAX_FIGURES figures; what is left out is counted in the
# output ("N more figures not shown"), never silently dropped, and results.json keeps it all.
MAX_FIGURES_PER_CHECK = 64
MAX_FIGURES = 4096
MAX_EVENTS_PER_CHECK = 64
NOT_RUN = "not_run"
SHOULD_HEADING = "SHOULD: fix after the MUSTs"
NOT_RUN_REASON = "the run stopped before this check"
# Order in which checks that did not pass are listed under scope limits: the gravest first.
_GRAVITY = ("failed", "blocked", "environment_blocked", "not_applicable", "skipped", NOT_RUN)

# Timeline event kinds, in the order a fault check walks through them (results.py EventKind):
# every event of a 1.3 results file carries one; older files' are recovered in report.legacy.
KINDS = ("fault", "detected", "repaired", "ready", "guest", "info")


@dataclass(frozen=True)
class Event:
    name: str
    t_s: float
    kind: str


@dataclass(frozen=True)
class Evidence:
    name: str  # as recorded in results.json
    href: str  # relative to the report's directory, percent-encoded; "" when not linkable
    present: bool


@dataclass
class CheckView:
    id: str
    marker: str
    title: str
    status: str
    reason: str
    duration_s: float
    metrics: dict[str, words.Metric]
    notes: list[str]
    timeline: list[Event]
    evidence: list[Evidence]
    phrases: list[str] = field(default_factory=list)
    apis: list[str] = field(default_factory=list)  # the plugin APIs it judges (older runs: [])
    hidden_figures: int = 0  # metrics past the caps above: not shown, not phrased
    hidden_events: int = 0  # timeline events past MAX_EVENTS_PER_CHECK (the latest ones)
    # Schema 1.2 (absent from older results): when it started, seconds into the run; the
    # failure's kind and the expired wait's typed fields; the requirement level and its source.
    started_s: float | None = None
    failure: str = ""
    wait: words.Wait | None = None
    requirement_level: str = ""
    requirement_source: str = ""
    said: str = ""  # the reason in words ("" when it is the reason as recorded)

    @property
    def status_word(self) -> str:
        return words.STATUS_WORDS.get(self.status, self.status)

    @property
    def result(self) -> str:
        return words.sentence(self.status, self.reason_words, self.phrases)

    @property
    def detail(self) -> str:
        return words.detail(self.status, self.reason_words, self.phrases)

    @property
    def reason_words(self) -> str:
        """The reason as a reader needs it: the expired wait's sentence, else the reason."""
        if self.said:
            return self.said
        return self.wait.sentence if self.wait is not None else self.reason

    @property
    def failure_kind(self) -> str:
        """'wait' (a deadline expired), 'assertion', or 'error' (the check itself broke); a
        failure that names no kind (a session check's verdict) is a judgement: 'assertion'."""
        if self.failure in ("wait", "assertion", "error"):
            return self.failure
        return "wait" if self.wait is not None else "assertion"

    @property
    def should(self) -> bool:
        """A SHOULD check (a practice): its failure is shown apart, to fix after the MUSTs."""
        return self.requirement_level == "SHOULD"

    @property
    def reason_capital(self) -> str:
        return words.capital(self.reason_words)

    @property
    def start(self) -> str:
        """When it started, from the run's start ('' when the results do not say)."""
        return "" if self.started_s is None else "+" + words.duration(self.started_s)

    @property
    def label(self) -> str:
        """The check's title, unless only its id is known (a planned check that never ran)."""
        return "" if self.title == self.id else self.title

    @property
    def is_fault(self) -> bool:
        return len(self.timeline) > 1

    @property
    def shown_metrics(self) -> dict[str, words.Metric]:
        """The metrics the report shows: the first ones recorded, within the caps."""
        return dict(itertools.islice(self.metrics.items(), len(self.metrics) - self.hidden_figures))

    def metric_rows(self) -> list[tuple[str, str, str]]:
        """(name, raw value, value in words) for the metrics table (the shown metrics)."""
        return [(k, str(v), words.value(k, v)) for k, v in self.shown_metrics.items()]


@dataclass
class ReportView:
    run: dict[str, Any]
    environment: list[tuple[str, str]]
    checks: list[CheckView]
    scope_limits: list[str]
    cleanup: str
    partial: bool
    logs: list[Evidence]
    results_href: str = "results.json"
    bundle_notes: list[str] = field(default_factory=list)  # what evidence.tar.gz left out

    @property
    def target(self) -> str:
        return str(self.run.get("target", "unknown"))

    @property
    def date(self) -> str:
        return str(self.run.get("started_at", ""))[:10]

    @property
    def title(self) -> str:
        return f"hvconform validation: {self.target} target, {self.date}"

    @property
    def failed(self) -> list[CheckView]:
        """Failed MUST checks (and checks of results that name no level): fix these first."""
        return [c for c in self.checks if c.status == "failed" and not c.should]

    @property
    def failed_should(self) -> list[CheckView]:
        """Failed SHOULD checks: failures too, shown apart (fix after the MUSTs)."""
        return [c for c in self.checks if c.status == "failed" and c.should]

    @property
    def failure_groups(self) -> list[tuple[str, str, list[CheckView]]]:
        """(anchor, heading, checks): the failures a reader fixes first, then the SHOULD ones."""
        groups = [
            ("failures", "Failures", self.failed),
            ("should-failures", SHOULD_HEADING, self.failed_should),
        ]
        return [group for group in groups if group[2]]

    @property
    def levelled(self) -> bool:
        """The results name requirement levels (schema 1.2): the table shows them."""
        return any(c.requirement_level for c in self.checks)

    @property
    def environment_folded(self) -> list[tuple[str, str, int]]:
        """(label, value, item count when the value is a long list to fold, else 0)."""
        return [(label, value, (folded(value) or (0, ""))[0]) for label, value in self.environment]

    @property
    def timed(self) -> bool:
        """The results say when each check started (schema 1.2): the table shows it."""
        return any(c.started_s is not None for c in self.checks)

    @property
    def fault_checks(self) -> list[CheckView]:
        return [c for c in self.checks if c.is_fault]

    @property
    def verdict(self) -> str:
        return verdict(
            {"run": self.run, "checks": [{"id": c.id, "status": c.status} for c in self.checks]},
            partial=self.partial,
        )

    @property
    def verdict_text(self) -> str:
        """The verdict as a reader needs it: a pass never hides the checks it did not verify."""
        unverified = sum(1 for c in self.checks if c.status not in ("passed", "failed"))
        if self.verdict != "PASSED" or not unverified:
            return self.verdict
        return f"PASSED; {words.plural(unverified, 'check', 'checks')} not verified"

    @property
    def counts(self) -> list[tuple[str, int]]:
        found = Counter(c.status for c in self.checks)
        return [(words.STATUS_WORDS.get(s, s), found[s]) for s in ("passed", *_GRAVITY) if found[s]]

    @property
    def left_out(self) -> str:
        """What the caps left out of this report, in one sentence ('' when nothing was)."""
        parts = [figures_left_out(sum(c.hidden_figures for c in self.checks))]
        events = sum(c.hidden_events for c in self.checks)
        if events:
            parts.append(
                f"{events} more timeline events (at most {MAX_EVENTS_PER_CHECK} per check)"
            )
        shown = "; ".join(p for p in parts if p)
        return f"{shown}: results.json holds every one." if shown else ""

    @property
    def summary(self) -> str:
        total = len(self.checks)
        parts = ", ".join(f"{n} {w.lower()}" for w, n in self.counts)
        return f"{total} checks: {parts}." if total else "No checks have results."


def figures_left_out(hidden: int) -> str:
    """The caps' statement, shared by report and compare ('' when no figure was left out)."""
    if not hidden:
        return ""
    return (
        f"{hidden} more figures not shown (at most {MAX_FIGURES_PER_CHECK} per check, "
        f"{MAX_FIGURES} in all)"
    )


def verdict(data: dict[str, Any], *, partial: bool = False) -> str:
    """FAILED beats BLOCKED beats ENVIRONMENT BLOCKED beats INCOMPLETE beats PASSED: a run that
    verified nothing (every check blocked) or that a dirty node cut short never reads as a pass."""
    statuses = {str(c.get("status")) for c in data.get("checks", [])}
    if "failed" in statuses:
        return "FAILED"
    if "blocked" in statuses:
        return "BLOCKED"
    if statuses and "passed" not in statuses and "environment_blocked" in statuses:
        return "ENVIRONMENT BLOCKED"
    run = data.get("run", {})
    ran = {str(c.get("id")) for c in data.get("checks", [])}
    if partial or run.get("partial") or NOT_RUN in statuses or set(run.get("planned", [])) - ran:
        return "INCOMPLETE"
    return "PASSED"


def _timeline(raw: list[dict[str, Any]], kinds: list[str]) -> list[Event]:
    events = [
        Event(str(e["name"]), float(e["t_s"]), kind) for e, kind in zip(raw, kinds, strict=True)
    ]
    return sorted(events, key=lambda e: e.t_s)  # stable: equal times keep the recorded order


def _link(path: Path, out_dir: Path) -> str:
    return text.href(Path(os.path.relpath(path, out_dir)).as_posix())


def _evidence(names: list[str], run_dir: Path, out_dir: Path) -> list[Evidence]:
    found = []
    for name in names:
        # Recorder.evidence stores names relative to <run>/evidence; a path with a slash is
        # taken relative to the run directory itself. A name that leaves the run directory
        # (absolute, '..') or is hidden is shown, never linked, and never looked up.
        if manifest.safe_name(name) is not None:
            found.append(Evidence(name, "", False))
            continue
        path = run_dir / name if "/" in name else run_dir / "evidence" / name
        present = path.is_file() and not path.is_symlink()
        found.append(Evidence(name, _link(path, out_dir), present))
    return found


def _check(
    raw: dict[str, Any], run_dir: Path, out_dir: Path, figure_room: int, *, typed: bool = True
) -> CheckView:
    """One check's view; at most `figure_room` of its metrics are shown (and phrased). A record
    of results 1.3 or later (`typed`) is read from its fields only; an older one through
    report.legacy, which recovers from its words what it has no field for."""
    events = [e for e in raw.get("timeline", []) if isinstance(e, dict)]
    if typed:
        wait = words.Wait.of(raw["wait"]) if isinstance(raw.get("wait"), dict) else None
        said, failure = "", str(raw.get("failure", ""))
        kinds = [str(e.get("kind", "info")) for e in events]
    else:
        old = legacy.read_pre_1_3_check(raw)
        wait, said, failure, kinds = old.wait, old.said, old.failure, old.kinds
    timeline = _timeline(events, kinds)
    view = CheckView(
        id=str(raw["id"]),
        marker=str(raw["marker"]),
        title=str(raw["title"]),
        status=str(raw["status"]),
        reason=str(raw.get("reason", "")),
        duration_s=float(raw.get("duration_s", 0.0)),
        metrics=dict(raw.get("metrics", {})),
        notes=[str(n) for n in raw.get("notes", [])],
        timeline=timeline[:MAX_EVENTS_PER_CHECK],
        evidence=_evidence([str(e) for e in raw.get("evidence", [])], run_dir, out_dir),
        apis=[str(a) for a in raw.get("apis", [])],
        hidden_events=max(0, len(timeline) - MAX_EVENTS_PER_CHECK),
        started_s=float(raw["started_s"]) if "started_s" in raw else None,
        failure=failure,
        wait=wait,
        requirement_level=str(raw.get("requirement_level", "")),
        requirement_source=str(raw.get("requirement_source", "")),
        said=said,
    )
    view.hidden_figures = max(0, len(view.metrics) - min(figure_room, MAX_FIGURES_PER_CHECK))
    fresh = sum(1 for e in view.timeline if e.kind == "guest")
    view.phrases = words.figures(view.shown_metrics, fresh)
    return view


def ran_order(checks: list[CheckView]) -> list[CheckView]:
    """The checks in the order they ran (by start); those that name no start (the session's
    own checks, decided at the end, and every check of results before 1.2) keep their order
    after them."""
    started = sorted((c for c in checks if c.started_s is not None), key=lambda c: c.started_s or 0)
    return started + [c for c in checks if c.started_s is None]


# An environment value listing more items than this is folded (HTML <details>; Markdown: its
# count, then the list), so the facts a reader looks for are not lost among 26 feature gates.
FOLD_ITEMS = 8


def folded(value: str) -> tuple[int, str] | None:
    """(item count, the list) when value is a long comma-separated list, else None."""
    items = value.split(", ")
    return (len(items), value) if len(items) > FOLD_ITEMS else None


def _not_run(check_id: str, reason: str) -> CheckView:
    return CheckView(check_id, "", check_id, NOT_RUN, reason, 0.0, {}, [], [], [])


def _device(path: str, info: Any) -> str:
    if not isinstance(info, dict) or not info.get("present"):
        error = info.get("error", "") if isinstance(info, dict) else ""
        return f"{path} absent" + (f" ({error})" if error else "")
    return (
        f"{path} character device {info.get('major')}:{info.get('minor')}, "
        f"mode {info.get('mode')}, uid {info.get('uid')}, gid {info.get('gid')}"
    )


def environment_rows(env: dict[str, Any], run: dict[str, Any]) -> list[tuple[str, str]]:
    """Label and value for every environment fact present; unknown scalar keys are kept too."""
    rows: list[tuple[str, str]] = []
    used = {"kernel", "machine", "distribution", "python", "plugin_version", "source_commit"}
    rows.append(("Kernel", f"{env.get('kernel', 'unknown')} ({env.get('machine', '?')})"))
    rows.append(("Distribution", str(env.get("distribution", "unknown"))))
    rows.append(("Python", str(env.get("python", "unknown"))))
    rows += plugin_facts.rows(env, run)  # which plugin, and what really ran as it
    if "cpu_count" in env or "memory_gib" in env:
        used.update({"cpu_count", "memory_gib"})
        rows.append(("Machine size", f"{env.get('cpu_count')} CPUs, {env.get('memory_gib')} GiB"))
    if isinstance(env.get("devices"), dict):
        used.add("devices")
        rows.append(
            ("Hypervisor devices", "; ".join(_device(p, i) for p, i in env["devices"].items()))
        )
    runtime = env.get("runtime")
    if isinstance(runtime, dict):
        used.add("runtime")
        rows.append(("Container runtime", " ".join(str(v) for v in runtime.values() if v)))
    if isinstance(env.get("images"), list):
        used.add("images")
        for image in env["images"]:
            ref = f"{image.get('name', '?')}@{image.get('digest', '?')}"
            rows.append(("Image", ref + (f" ({image['ref']})" if image.get("ref") else "")))
    node = env.get("node")
    if isinstance(node, dict):
        used.add("node")
        labels = {
            "name": "Node",
            "sku": "Node SKU",
            "os_image": "Node OS image",
            "kubernetes_version": "Kubernetes",
            "containerd_version": "containerd",
        }
        rows += [
            (labels.get(str(k), str(k)), str(v)) for k, v in node.items() if v not in ("", None)
        ]
    rows += env_facts.rows(env)  # schema 1.1: cgroups, suite, components, cluster, preconditions
    used.update(env_facts.KEYS)
    for key in sorted(set(env) - used):
        if isinstance(env[key], str | int | float) and key != "hostname":
            rows.append((key.replace("_", " ").capitalize(), str(env[key])))
    if env.get("hostname"):
        rows.append(("Host name", str(env["hostname"])))
    return rows


def _scope_limits(view: ReportView, env: dict[str, Any]) -> list[str]:
    limits = []
    for status in _GRAVITY[1:-1]:  # failures have their own section: not repeated here
        for c in (c for c in view.checks if c.status == status):
            limits.append(f"`{c.id}` ({c.title}): {c.status_word.lower()}: {c.reason_words}")
    not_run = [f"`{c.id}`" for c in view.checks if c.status == NOT_RUN]
    if not_run:
        why = str(view.run.get("interruption") or "The run stopped early.").rstrip(".")
        limits.append(f"Not run ({len(not_run)} checks): {why}: {', '.join(not_run)}.")
    markexpr = str(view.run.get("markexpr") or "")
    if markexpr:
        limits.append(f"Only checks matching `-m {markexpr}` were selected; others were not run.")
    devices: dict[str, Any] = env["devices"] if isinstance(env.get("devices"), dict) else {}
    for path, name in (("/dev/kvm", "KVM"), ("/dev/mshv", "MSHV")):
        info = devices.get(path)
        if isinstance(info, dict) and not info.get("present"):
            limits.append(f"No {name} validation: {path} is absent on this host.")
    limits += [str(s) for s in view.run.get("scope_limits", [])]
    return limits


_NOUNS = {"netns": ("network namespace", "network namespaces"), "process": ("process", "processes")}


def _plural(n: int, kind: str) -> str:
    one, many = _NOUNS.get(kind, (kind, kind + "s"))
    return f"{n} {one if n == 1 else many}"


def _cleanup(view: ReportView, ledger_kinds: Counter[str]) -> str:
    record = next((c for c in view.checks if c.marker == "cleanup"), None)
    if record is None:
        return "Cleanup was not verified: the results hold no cleanup record."
    entries = record.metrics.get("ledger_entries", "?")
    left = record.metrics.get("survivors", "?")
    kinds = ", ".join(_plural(n, k) for k, n in sorted(ledger_kinds.items()))
    text = words.plural(entries, "ledger entry", "ledger entries") + (
        f" ({kinds})" if kinds else ""
    )
    survivors = words.plural(left, "survivor", "survivors")
    if record.status == "passed":
        return f"{text}; {survivors}: everything the run created is gone."
    if record.status == "failed":
        return f"{text}; {survivors}. {record.reason[:1].upper()}{record.reason[1:]}."
    return f"Cleanup {record.status_word.lower()}: {record.reason}."


def _ledger_kinds(run_dir: Path) -> Counter[str]:
    """What the run created, by kind, from the ledger files next to results.json (if any)."""
    kinds: Counter[str] = Counter()
    for path in sorted((run_dir / "ledger").glob("*.jsonl")):
        if path.is_symlink() or not path.is_file():
            continue  # never follow a link planted in the run directory
        with path.open("rb") as handle:
            # Bounded: a ledger line is a few hundred bytes; a crafted huge file is cut short.
            for raw in handle.read(LEDGER_MAX_BYTES).splitlines():
                try:
                    entry = json.loads(raw.decode("utf-8", "replace"))
                except (ValueError, RecursionError):
                    continue  # a worker killed mid-write leaves a torn last line
                if isinstance(entry, dict) and entry.get("op") == "created":
                    kinds[text.visible(str(entry.get("kind", "?")))] += 1
    return kinds


def build(
    data: dict[str, Any],
    run_dir: Path,
    out_dir: Path,
    *,
    partial: bool = False,
    bundle_notes: Sequence[str] = (),
) -> ReportView:
    """The view of one results document whose files live in run_dir, for a report in out_dir.

    Every string of the document is made visible here, once (see hvconform.report.text), so
    no template, chart or XML writer ever sees a control character.
    """
    data = text.visible_tree(data)
    run = dict(data["run"])
    env = dict(data.get("environment", {}))
    checks: list[CheckView] = []
    room = MAX_FIGURES
    typed = str(data.get("schema_version", "")) not in legacy.PRE_1_3
    for raw in data["checks"]:
        checks.append(_check(raw, run_dir, out_dir, room, typed=typed))
        room -= len(checks[-1].metrics) - checks[-1].hidden_figures
    partial = partial or bool(run.get("partial"))
    checks = ran_order(checks)
    seen = {c.id for c in checks}
    checks += [_not_run(i, NOT_RUN_REASON) for i in run.get("planned", []) if i not in seen]
    logs = [
        Evidence(text.visible(p.name), _link(p, out_dir), True)
        for p in sorted(run_dir.glob("plugin-*.log"))
        if p.is_file() and not p.is_symlink()
    ]
    results_href = _link(run_dir / "results.json", out_dir)
    view = ReportView(run, environment_rows(env, run), checks, [], "", partial, logs, results_href)
    view.bundle_notes = list(bundle_notes)
    view.scope_limits = _scope_limits(view, env)
    view.cleanup = _cleanup(view, _ledger_kinds(run_dir))
    return view
