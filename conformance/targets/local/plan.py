"""What `--dry-run` prints for a target that runs on this machine without a cluster.

The cluster targets print their runbook's steps (hvconform.targets.cluster.run.plan_of); a
machine target has no runbook, so its family names what it would start, make and remove, and
this formats it the same way: a title, who is under test, numbered steps, then what cleanup
removes and verifies. Executes nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any


def machine_plan(title: str, plugin: Any, steps: Sequence[str], cleanup: Sequence[str]) -> str:
    """`plugin`: the plugin under test (hvconform.contract.plugin.PluginUnderTest)."""
    lines = [
        f"# hvconform plan: {title}; executes nothing",
        f"# plugin under test: {plugin.name} ({plugin.source})",
        "# host /dev/kvm: its metadata read before the run and compared after; never changed",
    ]
    lines += [f"{n}. {step}" for n, step in enumerate(steps, 1)]
    lines += [f"cleanup: {line}" for line in cleanup]
    return "\n".join(lines) + "\n"


def command_line(plugin: Any) -> str:
    """The plugin's command as the profile gives it (placeholders filled at run time)."""
    return shlex.join(plugin.command) if plugin.command else "(its image's entrypoint)"
