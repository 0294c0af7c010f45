"""The plugin under test, as it really ran: read back per node, recorded, and held to the profile.

Each worker reads what runs as the plugin from its node (`Node.plugin_ran`: the process's
/proc/<pid>/cmdline and executable, or the pod's image, the kubelet's image ID and the command)
once the node is up and once more at the end, and writes it with how its node's setup ended to
`plugin-ran/<worker>.json`. The controller puts every read-back into results.json
(`run.plugin_ran`) and judges them in the session-level check `plugin-identity`: a read-back that
contradicts the profile, or none where a node came up, fails the run, so a report can never name
a plugin that did not run. A node that never came up proves nothing either way (blocked).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from hvconform.contract.dra_profile import DRA_PLACEHOLDERS
from hvconform.contract.node import Node
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.ran import PluginRan
from hvconform.contract.results import CheckRecord, Status
from hvconform.contract.safewrite import write_atomic

CHECK_ID = "plugin-identity"
MARKER = "plugin"
TITLE = "The plugin that ran is the profile's"
DIR = "plugin-ran"
# Programs that exec what follows them (after their options or NAME=VALUE words): a profile may
# start its plugin through one, and the process that runs is then the rest of its command.
_WRAPPERS = frozenset(
    {"env", "nice", "ionice", "setpriv", "stdbuf", "taskset", "chrt", "tini", "dumb-init"}
)
# What the target fills (it picks them): the health address, a DRA driver's node name and
# credentials. Anything there is accepted; every other character of the argv must match.
_HEALTH = re.compile(
    r"\{(?:health_addr|health_host|health_port|" + "|".join(DRA_PLACEHOLDERS) + r")\}"
)


class NodeOutcome:
    """One worker's node: how its setup ended and every read-back of what ran (worker side)."""

    def __init__(self, out: Path, worker: str, target: str) -> None:
        self.path = out / DIR / f"{worker}.json"
        self.data: dict[str, Any] = {
            "worker": worker, "target": target, "node": "", "up": False, "setup": None,
            "reads": [],
        }  # fmt: skip

    def came_up(self, node: Node) -> None:
        self.data.update(up=True, node=node.name)
        self.read(node, "setup")
        self.runtime(node)

    def runtime(self, node: Node) -> None:
        """Beside what ran as the plugin, what ran its workloads: the node's container runtime
        as its daemon says it (`container_runtime`, where the node has one; issue 38)."""
        hook = getattr(node, "container_runtime", None)
        if not callable(hook):
            return
        try:
            facts = hook().to_json()
        except Exception as exc:  # the runtime is reported, never judged here
            facts = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        self.data["container_runtime"] = facts
        self.write()

    def read(self, node: Node, phase: str) -> None:
        """Read back what runs now; a failed read is recorded (and judged), never raised."""
        try:
            ran = node.plugin_ran().to_json()
        except Exception as exc:  # a target without plugin_ran, a pod gone: no identity
            ran = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        self.data["reads"].append({"phase": phase, **ran})
        self.write()

    def ended(self, status: str, reason: str) -> None:
        """How the node's setup ended when it never came up (or its teardown, when it did)."""
        key = "teardown" if self.data["up"] else "setup"
        self.data[key] = {"status": status, "reason": " ".join(reason.split())[:1000]}

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=2) + "\n")


def outcomes(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((out / DIR).glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            found.append(data)
    return found


def plugin_ran(out: Path) -> list[dict[str, Any]]:
    """run.plugin_ran: every read-back of every worker's node, in order."""
    return [
        {"worker": o["worker"], "node": o["node"], **read}
        for o in outcomes(out)
        for read in o.get("reads", [])
    ]


def container_runtimes(out: Path) -> list[dict[str, Any]]:
    """environment.container_runtime: each node's runtime, as its daemon said it."""
    return [
        {"worker": o["worker"], "node": o["node"], **o["container_runtime"]}
        for o in outcomes(out)
        if isinstance(o.get("container_runtime"), dict)
    ]


def never_up(out: Path) -> dict[str, str]:
    """Why each worker's node never came up (worker -> 'status: reason'); none: {}."""
    return {
        o["worker"]: f"{o['setup']['status']}: {o['setup']['reason']}"
        for o in outcomes(out)
        if not o.get("up") and isinstance(o.get("setup"), dict)
    }


def environment_line(out: Path) -> str:
    """The environment_blocked reason when no node came up because the machine lacks something
    (a kind node image that cannot be pulled, say); '' otherwise."""
    found = outcomes(out)
    if not found or any(o.get("up") for o in found):
        return ""
    for o in found:
        setup = o.get("setup") or {}
        if setup.get("status") == Status.ENVIRONMENT_BLOCKED.value:
            return str(setup.get("reason", ""))
    return ""


def from_json(data: dict[str, Any]) -> PluginRan:
    return PluginRan(
        how=str(data.get("how", "")),
        argv=tuple(str(a) for a in data.get("argv", [])),
        exe=str(data.get("exe", "")),
        pid=int(data.get("pid", 0)),
        image=str(data.get("image", "")),
        image_id=str(data.get("image_id", "")),
        where=str(data.get("where", "")),
        notes=tuple(str(n) for n in data.get("notes", [])),
    )


def _norm(ref: str) -> str:
    """An image reference as engines resolve it: docker.io/library/x:1 and x:1 are one image."""
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def _patterns(plugin: PluginUnderTest) -> list[re.Pattern[str]]:
    """The profile's argv as a target fills it; what the target picks (the health address, a
    DRA driver's node name and credentials) is any."""
    return [
        re.compile(".*".join(re.escape(plugin.fill(part)) for part in _HEALTH.split(arg)))
        for arg in plugin.command
    ]


def _same(ran: Sequence[str], want: Sequence[re.Pattern[str]]) -> bool:
    return len(ran) == len(want) and all(p.fullmatch(a) for a, p in zip(ran, want, strict=True))


def argv_matches(ran: Sequence[str], plugin: PluginUnderTest) -> bool:
    """The process runs the profile's command: as is; a script under its #! interpreter (one
    or two words before it); or what a wrapper the command starts with (env, nice) exec'ed."""
    want = _patterns(plugin)
    if _same(ran, want) or any(_same(ran[extra:], want) for extra in (1, 2)):
        return True
    if plugin.command and PurePosixPath(plugin.fill(plugin.command[0])).name in _WRAPPERS:
        return bool(ran) and any(_same(ran, want[k:]) for k in range(1, len(want)))
    return False


def mismatches(ran: PluginRan, plugin: PluginUnderTest) -> list[str]:
    """How what ran contradicts the profile (empty: it is the profile's plugin)."""
    if ran.how == "process":
        if argv_matches(ran.argv, plugin):
            return []
        return [
            f"process {shlex.join(ran.argv)} (executable {ran.exe or '?'}) is not the "
            f"profile's command {shlex.join(plugin.argv())}"
        ]
    want = plugin.image
    if want is None:
        return [f"{ran.how} ran image {ran.image}, but the profile deploys no image"]
    problems = []
    if _norm(ran.image) != _norm(want):
        problems.append(f"{ran.how} ran image {ran.image or '(none)'}, the profile's is {want}")
    pinned = want.partition("@")[2]
    # A pod's image ID is the kubelet's repo digest; an engine's bare image ID is the config's
    # digest, which never equals a manifest digest (the reference above carries the pin then).
    if pinned and (ran.how == "pod" or "@" in ran.image_id) and pinned not in ran.image_id:
        problems.append(
            f"{ran.how} image ID {ran.image_id or '(not reported)'} is not the pinned {pinned}"
        )
    return problems


def describe(read: dict[str, Any]) -> str:
    """One read-back in words (console, notes)."""
    if read.get("error"):
        return f"not read back: {read['error']}"
    ran = from_json(read)
    if ran.how == "process":
        return f"process {shlex.join(ran.argv)} (executable {ran.exe or '?'}, pid {ran.pid})"
    command = shlex.join(ran.argv) if ran.argv else "the image's entrypoint"
    return (
        f"{ran.how} {ran.where}: image {ran.image}, image ID {ran.image_id or '(not reported)'}"
        f", command {command}"
    )


def record(out: Path, plugin: PluginUnderTest) -> dict[str, Any] | None:
    """The plugin-identity check from every worker's read-backs; None when no node was set up
    at all (a run the preconditions blocked)."""
    found = outcomes(out)
    if not found:
        return None
    rec = CheckRecord(CHECK_ID, MARKER, TITLE)
    wrong, unread, reads = [], [], 0
    for o in found:
        rec.evidence.append(f"{DIR}/{o['worker']}.json")
        for read in o.get("reads", []):
            where = f"{o['worker']} at {read['phase']}"
            rec.notes.append(f"{where}: {describe(read)}")
            if read.get("error"):
                unread.append(f"{where}: {read['error']}")
                continue
            reads += 1
            wrong += [f"{where}: {p}" for p in mismatches(from_json(read), plugin)]
        if o.get("up") and not o.get("reads"):
            unread.append(f"{o['worker']}: no read-back recorded")
    rec.metrics = {"nodes": sum(1 for o in found if o.get("up")), "read_backs": reads}
    down = never_up(out)
    if wrong:
        rec.status = Status.FAILED.value
        rec.reason = "the plugin that ran is not the profile's: " + "; ".join(wrong[:4])
    elif unread:
        rec.status = Status.FAILED.value
        rec.reason = "what ran as the plugin could not be read back: " + "; ".join(unread[:4])
    elif not rec.metrics["nodes"]:
        rec.status = Status.BLOCKED.value
        why = "; ".join(f"{w}: {r}" for w, r in down.items()) or "no node came up"
        rec.reason = f"no plugin ran: the node never came up ({why})"
    return rec.to_json()
