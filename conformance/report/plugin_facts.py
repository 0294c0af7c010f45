"""The report's rows about the plugin under test: which plugin it was, and what really ran.

A report names only the plugin that ran. Results that record `run.plugin_ran` (read back from
each node's running process or pod) show it, one row per distinct identity, with the workers and
phases it was read at; this repository's version is shown only when the plugin under test is
this repository's (a third-party plugin's identity is what ran, never our version next to its
command line), and the source commit is the suite's. Older results are shown as they were
written. Every value is plain text: the templates escape it.
"""

from __future__ import annotations

import shlex
from typing import Any

# Environment keys shown here, so model.environment_rows does not repeat them as raw values.
KEYS = frozenset({"plugin_version", "source_commit"})
MAX_IDENTITIES = 8  # distinct read-backs shown; a run of many workers has one or two


def _argv(value: Any) -> str:
    return shlex.join(str(a) for a in value) if isinstance(value, list) else ""


def ran_text(read: dict[str, Any]) -> str:
    """One read-back in words: the process's argv and executable, or the image and its ID."""
    how = str(read.get("how", "?"))
    if how == "process":
        return (
            f"process {_argv(read.get('argv')) or '?'} (executable {read.get('exe') or '?'}"
            f", pid {read.get('pid', '?')})"
        )
    command = _argv(read.get("argv")) or "the image's entrypoint"
    return (
        f"{how} {read.get('where') or '?'}: image {read.get('image') or '?'}, image ID "
        f"{read.get('image_id') or '(not reported)'}, command {command}"
    )


def _identities(reads: list[Any]) -> list[tuple[str, str]]:
    """('Plugin ran', text (where and when)) per distinct read-back, errors included."""
    seen: dict[str, list[str]] = {}
    for read in reads:
        if not isinstance(read, dict):
            continue
        when = f"{read.get('worker', '?')} at {read.get('phase', '?')}"
        text = f"not read back: {read['error']}" if read.get("error") else ran_text(read)
        seen.setdefault(text, []).append(when)
    rows = [("Plugin ran", f"{text} ({', '.join(whens)})") for text, whens in seen.items()]
    if len(rows) > MAX_IDENTITIES:
        left = len(rows) - MAX_IDENTITIES
        rows = [*rows[:MAX_IDENTITIES], ("Plugin ran", f"{left} more: see results.json")]
    return rows


def rows(env: dict[str, Any], run: dict[str, Any]) -> list[tuple[str, str]]:
    """The plugin's rows of the environment section."""
    raw = run.get("plugin")
    plugin: dict[str, Any] = raw if isinstance(raw, dict) else {}
    reads = run.get("plugin_ran")
    if not isinstance(reads, list):  # results before the read-back: as they were written
        text = f"version {env.get('plugin_version', 'unknown')}"
        text += f", source commit {env.get('source_commit', 'unknown')}"
        out = [("Plugin", text)]
        return out + ([("Plugin command", str(run["plugin_cmd"]))] if run.get("plugin_cmd") else [])
    name = str(plugin.get("name") or "the plugin under test")
    if plugin.get("this_repository"):
        head = f"{name} {env.get('plugin_version', 'unknown')} (this repository's plugin)"
    else:
        source = f", profile {plugin['source']}" if plugin.get("source") else ""
        head = f"{name}{source}: not this repository's plugin; what ran is below"
    out = [("Plugin", head)]
    if run.get("plugin_cmd"):
        out.append(("Plugin command", str(run["plugin_cmd"])))
    images = any(isinstance(r, dict) and r.get("how") in ("container", "pod") for r in reads)
    if plugin.get("image") and images:  # what a container or pod had to run
        out.append(("Plugin image (profile)", str(plugin["image"])))
    out += _identities(reads) or [("Plugin ran", "not read back: no node came up")]
    if env.get("source_commit"):
        out.append(("Suite source commit", str(env["source_commit"])))
    return out
