"""Cluster run options, the Step a cluster lifecycle is made of, and the dry-run plan.

The same Step lists drive a real run and print as `hvconform run --target kind|aks --dry-run`, so
the plan a maintainer reads is the plan that executes. Building a plan touches nothing: no
executable is run and no API is called. This module imports no Kubernetes client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hvconform.contract.cluster_options import (
    HYPERVISORS,
    NODE_ACCESS,
    NODE_NAME,
    REPO_ROOT,
    ClusterOptions,
)

__all__ = ["HYPERVISORS", "NODE_ACCESS", "NODE_NAME", "REPO_ROOT", "ClusterOptions", "Step"]

Phase = Literal["setup", "cleanup", "verify"]


@dataclass(frozen=True)
class Step:
    """One thing a cluster lifecycle does, in a form that both executes and prints."""

    id: str
    phase: Phase
    what: str
    argv: tuple[str, ...] = ()  # an executable, run as is
    api: tuple[str, ...] = ()  # Kubernetes API requests, "METHOD path"
    node: tuple[str, ...] = ()  # commands run on the node through the node-access adapter
    manifest: str = ""  # YAML of the objects the API requests send
    arms: str = ""  # the cleanup step made due before this step runs


def render_plan(steps: list[Step], title: str = "") -> str:
    """A plan as text: setup in order, then cleanup in the order it runs, then verification."""
    lines = [f"# {title}"] if title else []
    lines.append("# dry run: nothing below has been executed")
    phases: tuple[tuple[Phase, str], ...] = (
        ("setup", "setup (in order; a failure at any step jumps to cleanup)"),
        ("cleanup", "cleanup (always runs, also on failure, Ctrl-C or SIGTERM)"),
        ("verify", "verification (after cleanup; reported, never assumed)"),
    )
    n = 0
    for phase, heading in phases:
        chosen = [s for s in steps if s.phase == phase]
        if not chosen:
            continue
        lines += ["", f"## {heading}"]
        if phase == "cleanup":
            lines.append("#   (the checks of the suite run between setup and cleanup)")
        for step in chosen:
            n += 1
            armed = f"  [arms cleanup: {step.arms}]" if step.arms else ""
            lines.append(f"{n:>2}. [{step.id}] {step.what}{armed}")
            lines += [f"      $ {_shell(step.argv)}"] if step.argv else []
            lines += [f"      node$ {cmd}" for cmd in step.node]
            lines += [f"      api: {req}" for req in step.api]
            if step.manifest:
                lines += ["      manifest:"]
                lines += [f"        {ln}" if ln else "" for ln in step.manifest.splitlines()]
    return "\n".join(lines) + "\n"


def _shell(argv: tuple[str, ...]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in argv)
