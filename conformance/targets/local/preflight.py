"""The local family's hooks for the suite: what the local target needs before its first check,
and what it ran on.

`preconditions(target, runtime)` lists the external components in the order they depend on each
other (root before anything that mknods or mounts); `environment(target, runtime)` adds what the
target runs on top of the host facts every run records. The container runtime of the local
target has its own module (`hvconform.targets.container.preflight`), which starts from these.
"""

from __future__ import annotations

from typing import Any

from hvconform.contract import hostfacts
from hvconform.contract.preconditions import Found, Requirement, tool, version_of
from hvconform.targets.local.runtime import workload_python
from hvconform.targets.local.workload_program import FIX, NoWorkloadPython, candidates

UTIL_LINUX_FIX = "apt-get install util-linux mount"


def _workload_interpreter() -> Requirement:
    def probe() -> Found:
        try:
            python = workload_python()
        except NoWorkloadPython as exc:
            return Found(str(exc), False, "the runtime, as uid 65534")
        return Found(python, True, "the runtime, as uid 65534")

    return Requirement(
        "workload interpreter",
        "the guest workload runs as uid/gid 65534 with no capabilities",
        "a Python >= 3.11 that uid 65534 can execute",
        FIX,
        probe,
    )


def local_requirements(*, workloads: bool = True) -> list[Requirement]:
    """Root, /dev/kvm, the mount tools and (when workloads run through this family's runtime)
    an interpreter for them: shared by every target that builds on the local family."""
    needs = [
        hostfacts.root("mknod, mounts and namespaces of the node root and the sandboxes"),
        hostfacts.kvm("the plugin's usability probe and every guest workload"),
        tool(
            "mount (util-linux)",
            ["mount", "--version"],
            minimum="2.27",
            feature="bind, rshared, read-only and tmpfs mounts of the node root",
            fix=UTIL_LINUX_FIX,
        ),
        tool(
            "nsenter (util-linux)",
            ["nsenter", "--version"],
            minimum="2.27",
            feature="faults made inside the plugin's mount namespace",
            fix=UTIL_LINUX_FIX,
        ),
    ]
    return [*needs, _workload_interpreter()] if workloads else needs


def preconditions(target: str = "local", runtime: str = "process") -> list[Requirement]:
    del target, runtime  # the process runtime of the local target is the only user
    return local_requirements()


def environment(target: str = "local", runtime: str = "process") -> dict[str, Any]:
    """The tools the local target ran with, asked from themselves."""
    del target, runtime
    try:
        python = workload_python()
    except NoWorkloadPython:
        python = ""
    return {
        "components": {
            "util-linux": version_of(["mount", "--version"], r"util-linux\s+(\S+)"),
            "workload python": (
                version_of([python, "--version"])
                if python
                else {"version": "unavailable", "command": ", ".join(candidates())}
            ),
        }
    }
