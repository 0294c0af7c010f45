"""pytest glue: options, the per-worker node, per-check records, and results.json at the end.

Workers put each check's record into the report's user_properties; the controller (or the single
process without xdist) collects them, verifies cleanup across every worker's ledger, and writes
results.json. Each phase's status and reason travel as typed fields (hvconform.suite.outcomes),
never read back from pytest's text, so nothing skipped looks passed.
The controller is also the run-level owner of what workers share on the host (/run/netns:
hvconform.targets.host.netns.RunOwner): started before any worker, released once all ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract import runcontext, target_report
from hvconform.contract.dra import plugin_api
from hvconform.contract.dra_profile import API_TITLES
from hvconform.contract.ledger import Entry, read_entries
from hvconform.contract.node import Node
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED
from hvconform.contract.results import (
    FEATURE_GATES_FILE,
    Blocked,
    CheckRecord,
    NotApplicable,
    Outcome,
    Recorder,
    Status,
    TimelineEvent,
    describe_failure,
    write_results,
)
from hvconform.contract.runcontext import RunContext
from hvconform.contract.target_report import merge_reports
from hvconform.metadata.twophase import TwoPhase
from hvconform.scenarios import BY_ID, CATALOGUE, CLEANUP, VALIDATE_MARK, Check
from hvconform.suite import environment, evidence, identity, outcomes, preflight, session_checks
from hvconform.targets import TARGETS, open_target
from hvconform.targets.host.netns import RunOwner

USER_PROP = "hv_check"
# Preconditions: checked before the first check; an unmet one blocks every check.
pytest_plugins = ["hvconform.suite.preflight"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hvconform")
    group.addoption(
        "--context",
        default="",
        help="the run context hvconform run wrote (run-context.json); every input comes from it",
    )


def pytest_configure(config: pytest.Config) -> None:
    for check in (*CATALOGUE, CLEANUP):
        config.addinivalue_line("markers", f"{check.marker}: {check.marker} checks")
    config.addinivalue_line("markers", "check_id(id): stable check id used by reports")
    config.addinivalue_line(
        "markers", f"{VALIDATE_MARK}: the validate subset (disturbs nothing on a serving node)"
    )
    path = config.getoption("--context")
    if path:
        runcontext.install(runcontext.read(path), Path(path).resolve())
    if not hasattr(config, "workerinput"):  # controller or single process
        ctx = context()
        ctx.out.mkdir(parents=True, exist_ok=True)
        config.stash[_RUN] = {"started": time.time(), "records": {}, "done": 0}
        # Before xdist starts the workers (pytest_sessionstart): they inherit the owner's id.
        owner = RunOwner()
        owner.start()
        config.stash[_NETNS] = owner


def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that never reached its end (a usage error) still ends its ownership."""
    if _NETNS in config.stash:
        config.stash[_NETNS].release(_ledger_entries())


def _ledger_entries() -> list[Entry]:
    """Every worker's ledger, in the run's out dir."""
    return read_entries(sorted((run_dir() / "ledger").glob("*.jsonl")))


_RUN = pytest.StashKey[dict[str, Any]]()
_NETNS = pytest.StashKey[RunOwner]()


def context() -> RunContext:
    return runcontext.current()


def run_dir() -> Path:
    return context().out


def worker_id(config: pytest.Config) -> str:
    return str(getattr(config, "workerinput", {}).get("workerid", "main"))


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    config = request.config
    ctx = context()
    target = ctx.target
    # The two-phase host device check wraps the node's whole life: snapshot before it exists,
    # startup verdict once it is up, final verdict after it is gone. On kind the cluster
    # lifecycle runs the phases itself (startup takes the node's kvm group); an AKS node's device
    # is not on this host, so there is nothing here to check.
    phases = TARGETS[target].host_metadata  # who runs the two-phase check: the target's trait
    two_phase = None if phases == "none" else TwoPhase("/dev/kvm")
    local_phases = phases == "suite"
    # What runs as the plugin, read back once the node is up and once at the end, and how the
    # node's setup ended when it never came up (hvconform.suite.identity).
    outcome = identity.NodeOutcome(run_dir(), worker_id(config), target)
    if two_phase is not None and local_phases:
        two_phase.snapshot_original()
    try:
        with open_target(
            ctx, worker=worker_id(config), metadata=None if local_phases else two_phase
        ) as target_node:
            if two_phase is not None and local_phases:
                two_phase.check_startup(None)  # no udev on these nodes: unchanged is the rule
            outcome.came_up(target_node)
            yield target_node
            outcome.read(target_node, "end")
    except Outcome as exc:  # not applicable or environment blocked: every check on it says so
        outcome.ended(exc.status.value, exc.reason)
        outcomes.skip(exc)
    except BaseException as exc:
        outcome.ended("error", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        outcome.write()
        if two_phase is not None:
            if local_phases:
                two_phase.check_final()
            out = run_dir() / "metadata"
            out.mkdir(exist_ok=True)
            summary = json.dumps(two_phase.summary(), indent=2)
            (out / f"{worker_id(config)}.json").write_text(summary)


@pytest.fixture
def check_record(request: pytest.FixtureRequest) -> Iterator[tuple[Check, Recorder]]:
    marker = request.node.get_closest_marker("check_id")
    assert marker is not None, "every conformance test carries check_id"
    check = BY_ID[marker.args[0]]
    record = CheckRecord(id=check.id, marker=check.marker, title=check.title, apis=list(check.apis))
    record.requirement_level = check.requirement_level
    record.requirement_source = check.requirement_source
    rec = Recorder(record, run_dir() / "evidence")
    started_at = time.time()  # the controller turns it into the offset from the run's start
    yield check, rec
    found = {**record.to_json(), "started_at": started_at}
    request.node.user_properties.append((USER_PROP, json.dumps(found)))


# Per worker: the check that left this worker's node dirty, and what could not be restored.
_DIRTY: dict[str, str] = {}


def run_check(node: Node, check: Check, rec: Recorder) -> None:
    """Run one scenario, then put the node back to its baseline (verified) whatever happened.

    The recorder carries the status and reason as fields. Statuses other than pass and fail
    are typed outcomes (pytest only shows them as skips). A node that cannot be restored blocks
    the checks after it on that node: they end `blocked`, naming the check and the cause.
    """
    if _DIRTY:
        _end(rec, Blocked(f"{_DIRTY['by']} left the node dirty: {_DIRTY['why']}"))
    api = plugin_api(node)
    if api not in check.apis:
        judged = " and ".join(API_TITLES[a] for a in check.apis)
        _end(
            rec,
            NotApplicable(f"judges {judged}; the plugin under test speaks {API_TITLES[api]}"),
        )
    window = evidence.open_window(node)  # the check's evidence covers only its own window
    with target_report.running(check.id):  # what the target records now is this check's
        try:
            check.run(node, rec)
        except Outcome as exc:
            _end(rec, exc)
        except Exception as exc:  # the reason in words, from the exception's typed fields
            rec.record.failure, rec.record.reason, rec.record.wait = describe_failure(exc)
            rec.record.status = Status.FAILED.value
            raise
        finally:
            at_end = evidence.at_check_end(node, window)  # before the restore replaces the plugin
            _restore(node, check, rec)
            evidence.write(node, rec, window, at_end)


def _end(rec: Recorder, outcome: Outcome) -> None:
    rec.record.status, rec.record.reason = outcome.status.value, outcome.reason
    outcomes.skip(outcome)


def _restore(node: Node, check: Check, rec: Recorder) -> None:
    t0 = time.monotonic()
    try:
        problems = node.restore_baseline()
    except Exception as exc:  # the restore itself broke: nothing after it can be trusted
        problems = [f"the restore itself failed: {exc}"]
    rec.metric("restore_s", round(time.monotonic() - t0, 6))
    if problems:
        _DIRTY.update(by=check.id, why="; ".join(problems))
        rec.note(f"node not restored after this check: {_DIRTY['why']}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On the worker that ran the phase, while the exception object is at hand: its typed
    fields ride on the report to the controller."""
    report = yield
    found = outcomes.of_call(item, call)
    if found is not None:
        outcomes.attach(report, found)
    return report


def _outcome_of(report: pytest.TestReport) -> dict[str, Any]:
    """A phase's status and reason (a failure: its kind and wait) from the report's typed
    fields. Only a report no runner made (xdist's for a crashed worker) carries none: it failed,
    and pytest's own first line says how."""
    if report.passed:
        return {"status": Status.PASSED.value, "reason": ""}
    found = outcomes.read(report)
    if found is not None:
        return found
    if report.skipped:
        return {"status": Status.SKIPPED.value, "reason": "skipped"}
    lines = str(report.longrepr).strip().splitlines()
    return {"status": Status.FAILED.value, "reason": lines[0] if lines else "failed"}


def _check_id(nodeid: str) -> str | None:
    check_id = nodeid.rsplit("[", 1)[-1].split("]", 1)[0] if "[" in nodeid else ""
    return check_id if check_id in BY_ID else None


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    """No progress letters: each check's own `[hvconform N]` line is the progress (pytest's
    dots and s's interleaved with them, one per line)."""
    if report.when == "call" or not report.passed:
        category = "error" if report.failed and report.when != "call" else report.outcome
        return category, "", report.outcome.upper()
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    check_id = _check_id(report.nodeid)
    if config is None or _RUN not in config.stash or check_id is None:
        return
    run = config.stash[_RUN]
    base = BY_ID[check_id]
    entry = run["records"].setdefault(
        check_id, CheckRecord(base.id, base.marker, base.title).to_json()
    )
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 6)
    if report.when == "call" or not report.passed:
        found = _outcome_of(report)
        if entry["status"] == Status.PASSED.value:  # the first non-pass wins
            entry["status"], entry["reason"] = found["status"], found["reason"]
            for key in ("failure", "wait"):
                if key in found:
                    entry[key] = found[key]
    if report.when != "teardown":
        return
    raw = str(dict(report.user_properties).get(USER_PROP) or "")
    if raw:
        found = json.loads(raw)
        for key in ("metrics", "evidence", "timeline", "notes"):
            entry[key] = found[key]
        for key in ("requirement_level", "requirement_source", "failure", "wait"):
            if key in found:
                entry[key] = found[key]
        if "started_at" in found:
            entry["started_s"] = round(max(0.0, found["started_at"] - run["started"]), 3)
        if entry["status"] == Status.FAILED.value and found.get("reason"):
            entry["reason"] = found["reason"]  # the scenario's failure in words
    run["done"] += 1
    _progress(config, run, entry)


_CONFIG: dict[str, pytest.Config] = {}


def _plan(config: pytest.Config, nodeids: list[str]) -> None:
    if _RUN in config.stash:
        planned = config.stash[_RUN].setdefault("planned", [])
        for nodeid in nodeids:
            check_id = _check_id(nodeid)
            if check_id is not None and check_id not in planned:
                planned.append(check_id)


def pytest_collection_finish(session: pytest.Session) -> None:
    _plan(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    if "config" in _CONFIG:
        _plan(_CONFIG["config"], ids)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config
    # xdist writes its worker status ("bringing up nodes...") once per phase when the output
    # is not a terminal; the checks' own progress lines say more, once.
    dist = session.config.pluginmanager.getplugin("terminaldistreporter")
    if dist is not None:
        dist.ensure_show_status = lambda: None


def _progress(config: pytest.Config, run: dict[str, Any], record: dict[str, Any]) -> None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    metrics = ", ".join(
        f"{k}={v}"
        for k, v in record.get("metrics", {}).items()
        if k.endswith("_s") or k in ("reads", "read_errors", "torn_reads")
    )
    line = f"[hvconform {run['done']}] {record['id']}: {record['status']}"
    line += f" ({metrics})" if metrics else ""
    line += f" - {record['reason']}" if record.get("reason") else ""
    if tr is not None:
        if getattr(tr._tw, "width_of_current_line", 0):  # after pytest's "s" or "[100%]"
            tr._tw.line()
        tr.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput") or _RUN not in config.stash:
        return
    run = config.stash[_RUN]
    ctx = context()
    out = ctx.out
    records = run["records"]
    # Every worker has ended (xdist's own sessionfinish tore them down): what they shared on
    # the host is released by the run, before the ledgers are verified.
    if _NETNS in config.stash:
        config.stash[_NETNS].release(_ledger_entries())
        del config.stash[_NETNS]
    # cleanup, metadata-two-phase and plugin-identity, once every worker is done
    cluster, blocked = session_checks.decide(out, records, ctx.plugin)
    for check_id in session_checks.ORDER:  # on the console as every check is
        if check_id in records:
            run["done"] += 1
            _progress(config, run, records[check_id])
    # What the targets saw (image IDs, runtime inspection, guest runs), per worker.
    targets = merge_reports(out, records)
    order = [c.id for c in CATALOGUE] + list(session_checks.ORDER)
    checks = [
        CheckRecord(**{**r, "timeline": [TimelineEvent(**t) for t in r.get("timeline", [])]})
        for r in sorted(records.values(), key=lambda r: order.index(r["id"]))
    ]
    planned = [i for i in run.get("planned", []) if i in BY_ID]
    missing = [i for i in planned if i not in records]
    interrupted = session.exitstatus == pytest.ExitCode.INTERRUPTED
    partial = interrupted or bool(missing)
    failed = any(c.status == Status.FAILED.value for c in checks)
    if failed and session.exitstatus == 0:
        session.exitstatus = 1
    if blocked and session.exitstatus == 0:  # no node came up for want of something: never a pass
        session.exitstatus = EXIT_ENVIRONMENT_BLOCKED
        run["blocked"] = blocked
    counts: dict[str, int] = {}
    for c in checks:
        counts[c.status] = counts.get(c.status, 0) + 1
    finished = time.time()
    write_results(
        out / "results.json",
        run={
            "id": ctx.run_id,
            "target": ctx.target,
            "runtime": ctx.runtime,
            "started_at": environment.iso(run["started"]),
            "finished_at": environment.iso(finished),
            "duration_s": round(finished - run["started"], 3),
            "exit_code": int(session.exitstatus),
            "plugin_cmd": ctx.plugin.summary()["command"],
            "plugin": {**ctx.plugin.summary(), "this_repository": environment.ours(ctx.plugin)},
            "plugin_ran": identity.plugin_ran(out),
            "markexpr": config.getoption("-m") or "",
            "mode": ctx.mode,
            "counts": counts,
            "workers": str(config.getoption("numprocesses", None) or 0),
            "planned": planned,
            "partial": partial,
            **(
                {
                    "interruption": (
                        "interrupted" if interrupted else "not run: " + ", ".join(missing)
                    )
                }
                if partial
                else {}
            ),
        },
        environment={
            **environment.collect_for(ctx.target, ctx.runtime),
            "plugin_version": environment.plugin_version(ctx.plugin),
            **({"targets": targets} if targets else {}),
            **(
                {"container_runtime": runtimes}
                if (runtimes := identity.container_runtimes(out))
                else {}
            ),
            **_feature_gates(out),
            **({"cluster": cluster} if cluster else {}),
        },
        checks=checks,
    )


def _feature_gates(out: Path) -> dict[str, Any]:
    """The feature gates a target set and read from its components, when it wrote them."""
    try:
        return {"feature_gates": json.loads((out / FEATURE_GATES_FILE).read_text())}
    except (OSError, ValueError):
        return {}


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """A run whose nodes never came up for want of something says so once, as preflight does."""
    line = config.stash[_RUN].get("blocked", "") if _RUN in config.stash else ""
    if line and not preflight.blocked_line():
        terminalreporter.write_line(f"hvconform: environment blocked, no check ran: {line}")
