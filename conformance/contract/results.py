"""What a check found: statuses, the per-check recorder scenarios write to, and results.json."""

from __future__ import annotations

import enum
import json
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from hvconform.contract import datafiles
from hvconform.contract.safewrite import write_atomic
from hvconform.contract.wait import WaitExpired

# results.schema.json; README "Reports" says what changed. 1.2 added optional per-check fields
# (started_s, failure, wait, requirement_level, requirement_source); 1.3 gives every timeline
# event its kind and every failed check its failure kind, so a report reads fields, never words;
# 1.0, 1.1 and 1.2 still read.
SCHEMA_VERSION = "1.3"


class Status(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_APPLICABLE = "not_applicable"
    ENVIRONMENT_BLOCKED = "environment_blocked"
    # An earlier check left the node dirty and it could not be restored: not this check's verdict.
    BLOCKED = "blocked"


class Outcome(Exception):
    """A check's end other than passed or failed, its status a field: the suite records
    `status` and `reason` as they are, and never reads a status back from a message."""

    status: ClassVar[Status] = Status.SKIPPED

    @property
    def reason(self) -> str:
        return str(self)


class NotApplicable(Outcome):
    """The check does not apply to this target or plugin (e.g. no kubelet restart on AKS Automatic)."""

    status = Status.NOT_APPLICABLE


class EnvironmentBlocked(Outcome):
    """The environment prevents the check (missing /dev/kvm, admission policy): never a pass."""

    status = Status.ENVIRONMENT_BLOCKED


class Blocked(Outcome):
    """An earlier check left the node dirty and it could not be restored."""

    status = Status.BLOCKED


class EventKind(enum.StrEnum):
    """What a timeline point is, in the order a fault check walks through them; the report
    colours events and draws outages (fault to ready) from this, never from the event's name."""

    FAULT = "fault"
    DETECTED = "detected"
    REPAIRED = "repaired"
    READY = "ready"
    GUEST = "guest"  # a fresh guest ran on the node (the report counts these)
    INFO = "info"


@dataclass
class TimelineEvent:
    name: str
    t_s: float  # seconds since the check started (monotonic clock)
    kind: str = EventKind.INFO.value  # schema 1.3: an EventKind value


# A target may write this into the run dir: the feature gates it sets and those its components
# report enabled; results.json's environment carries it as `feature_gates`.
FEATURE_GATES_FILE = "feature-gates.json"


@dataclass
class CheckRecord:
    id: str
    marker: str
    title: str
    status: str = Status.PASSED.value
    reason: str = ""
    duration_s: float = 0.0
    metrics: dict[str, float | int | str] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    timeline: list[TimelineEvent] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    apis: list[str] = field(default_factory=list)  # the plugin APIs the check judges
    # Schema 1.2, optional (left out of results.json when unset):
    started_s: float | None = None  # when it started, seconds after the run started
    failure: str = ""  # a failed check: "wait", "assertion" or "error" (the check broke)
    wait: dict[str, Any] | None = None  # the expired wait's typed fields (wait.WaitFacts)
    requirement_level: str = ""  # "MUST" or "SHOULD" (hvconform.scenarios)
    requirement_source: str = ""  # the kubelet code path or the seed sentence behind it

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in _OPTIONAL:
            if data[key] in (None, ""):
                del data[key]
        return data


_OPTIONAL = ("started_s", "failure", "wait", "requirement_level", "requirement_source")


def describe_failure(exc: BaseException) -> tuple[str, str, dict[str, Any] | None]:
    """(failure kind, reason in words, the wait's typed fields) of what ended a check.

    No Python class name reaches a reason: an expired wait is its sentence (wait.sentence), an
    assertion its own message, anything else "the check could not go on: <message>" with the
    kind "error" saying the check itself broke, not the plugin.
    """
    lines = str(exc).strip().splitlines()
    message = lines[0].strip() if lines else ""
    if isinstance(exc, WaitExpired) and exc.facts is not None:
        return "wait", exc.facts.sentence(), exc.facts.to_json()
    if isinstance(exc, AssertionError):
        return "assertion", message or "an assertion failed without a message", None
    return "error", f"the check could not go on: {message or 'it broke without a message'}", None


class Recorder:
    """Handed to a scenario: metrics, evidence and a timeline of what it observed."""

    def __init__(self, record: CheckRecord, evidence_dir: Path) -> None:
        self.record = record
        self.evidence_dir = evidence_dir
        self._t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def event(
        self, name: str, at: float | None = None, *, kind: EventKind = EventKind.INFO
    ) -> float:
        """Mark a timeline point (now, or at a monotonic time) of a kind; returns its offset in
        seconds. The kind is what the report reads; the name is only shown."""
        t = (time.monotonic() if at is None else at) - self._t0
        self.record.timeline.append(TimelineEvent(name, round(t, 6), EventKind(kind).value))
        return t

    def metric(self, name: str, value: float | int | str) -> None:
        self.record.metrics[name] = round(value, 6) if isinstance(value, float) else value

    def note(self, text: str) -> None:
        self.record.notes.append(text)

    def evidence(self, name: str, content: str | bytes) -> Path:
        """Keep an artefact (log, spec bytes, status) next to the results."""
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        path = self.evidence_dir / f"{self.record.id}-{name}"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        self.record.evidence.append(str(path.name))
        return path


def load_schema() -> dict[str, Any]:
    text = resources.files(datafiles.import_name()).joinpath("results.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def validate_results(data: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when data does not follow the shipped schema."""
    import jsonschema

    jsonschema.validate(data, load_schema())


def write_results(
    path: Path, run: dict[str, Any], environment: dict[str, Any], checks: list[CheckRecord]
) -> dict[str, Any]:
    data = {
        "schema_version": SCHEMA_VERSION,
        "run": run,
        "environment": environment,
        "checks": [c.to_json() for c in checks],
    }
    validate_results(data)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return data
