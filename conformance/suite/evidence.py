"""Each check's evidence cut to its own window: from the moment it started to the end of its
restore, never the run's whole history.

A window is opened when a check starts and written when its restore has ended, as
`<check>-plugin.log` (the plugin's log lines of the window) and `<check>-kubelet.log` (what the
kubelet, or the kubelet emulator, recorded in it: registrations, ListAndWatch lists, allocations,
node events), each with one `# hvconform:` line first saying how it was cut. Where the node can
say it exactly (the local family: `plugin_log_offset`/`plugin_log_since`, a byte offset of the
plugin's log file), the cut is exact; elsewhere the last lines of the log when the check started
are found again in the log at its end (`plugin_log_tail`, every target has it) and what follows
them is the window. The check's own timeline is already its window (results.json).

Where the cut is by anchor, the restore may replace the plugin (a pod restarted, a container
re-created) and with it the log the check's failure is in: what the plugin had written when
the check ended is therefore read before the restore (`at_check_end`), and the restore's lines
follow it, said to be a new instance's when the log they come from is not the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hvconform.contract.results import Recorder

PLUGIN_LOG = "plugin.log"
KUBELET_LOG = "kubelet.log"
MAX_LINES = 5000  # per evidence file: a check's window is seconds to minutes of a plugin's log
MAX_BYTES = 4 * 1024 * 1024
ANCHOR_LINES = 8  # lines of the log at the check's start that find the cut again at its end
HEADER = "# hvconform: "


@dataclass
class Window:
    """Where a check's window starts, in each source the node offers."""

    t0: float  # monotonic: the kubelet's records and node events since then
    offset: int | None = None  # the plugin log's byte offset (exact), when the node has one
    anchor: list[str] = field(default_factory=list)  # else: the log's last lines at the start


def _hook(node: Any, name: str) -> Callable[..., Any] | None:
    found = getattr(node, name, None)
    return found if callable(found) else None


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def open_window(node: Any) -> Window:
    """Taken as a check starts; never fails (a log that cannot be read starts empty)."""
    window = Window(time.monotonic())
    offset = _hook(node, "plugin_log_offset")
    try:
        window.offset = offset() if offset is not None else None
        if window.offset is None:
            window.anchor = _lines(node.plugin_log_tail(ANCHOR_LINES))
    except Exception:  # evidence never decides a verdict
        window.anchor = []
    return window


def after_anchor(lines: list[str], anchor: list[str]) -> int | None:
    """Index of the first line after the last place `anchor` occurs as a run of lines; 0 for no
    anchor (the log was empty when the check started); None when it is not found."""
    if not anchor:
        return 0
    size = len(anchor)
    for end in range(len(lines), size - 1, -1):
        if lines[end - size : end] == anchor:
            return end
    return None


def plugin_window(node: Any, window: Window) -> str:
    """The plugin's log lines written during the window, after one header line."""
    since = _hook(node, "plugin_log_since")
    if window.offset is not None and since is not None:
        body: str = since(window.offset, MAX_BYTES)
        return f"{HEADER}the plugin's log from byte {window.offset} (the check's start)\n{body}"
    lines = _lines(node.plugin_log_tail(MAX_LINES))
    start = after_anchor(lines, window.anchor)
    if start is None:
        head = (
            f"the check's start was not found in the plugin's last {MAX_LINES} log lines (a new "
            "plugin instance with a log of its own, or more lines than that): all of them"
        )
        start = 0
    else:
        head = "the plugin's log after the lines it had written when the check started"
    kept = "\n".join(lines[start:])
    return f"{HEADER}{head}\n{kept}\n" if kept else f"{HEADER}{head}\n"


def at_check_end(node: Any, window: Window) -> str | None:
    """The plugin's window as the check left it, read before the restore can replace the
    plugin; None where the cut is exact (a log file of the node's own loses nothing)."""
    if window.offset is not None:
        return None
    try:
        return plugin_window(node, window)
    except Exception:  # evidence never decides a verdict
        return None


def with_restore(node: Any, window: Window, at_end: str) -> str:
    """`at_end`, then the lines the plugin wrote during the restore: found after the last lines
    it had written at the check's end, or the whole log of the instance that replaced it."""
    kept = _lines(at_end)[1:]  # after plugin_window's one header line
    anchor = kept[-ANCHOR_LINES:]
    lines = _lines(node.plugin_log_tail(MAX_LINES))
    start = after_anchor(lines, anchor or window.anchor)
    if start is None:
        head = (
            "the restore replaced the plugin (its log does not hold the lines above): the new "
            "instance's log"
        )
        start = 0
    else:
        head = "the plugin's log during the restore"
    rest = "\n".join(lines[start:])
    return f"{at_end.rstrip()}\n{HEADER}{head}\n" + (f"{rest}\n" if rest else "")


def kubelet_window(node: Any, window: Window) -> str | None:
    """The kubelet's (or emulator's) records of the window, t relative to the check's start;
    None when the node keeps none."""
    records = _hook(node, "kubelet_records_since")
    if records is not None:
        lines: list[str] = records(window.t0)
        source = "the kubelet emulator's records"
    else:
        events = _hook(node, "node_events")
        if events is None:
            return None
        lines = [
            f"{e.t - window.t0:+.3f}s {e.kind}" + (f" {e.value}" if e.value else "")
            + (f" {e.detail}" if e.detail else "")
            for e in events(window.t0)
        ]  # fmt: skip
        source = "the kubelet's node events"
    shown = lines[-MAX_LINES:]
    cut = f" (the last {MAX_LINES} of {len(lines)})" if len(lines) > MAX_LINES else ""
    head = f"{HEADER}{source} since the check's start, seconds after it{cut}\n"
    return head + "".join(f"{line}\n" for line in shown)


def write(node: Any, rec: Recorder, window: Window, at_end: str | None = None) -> None:
    """The check's evidence files; a source that cannot be read is noted, never fatal.
    `at_end`: the plugin's window read when the check ended (at_check_end), before the restore."""

    def plugin(node: Any, window: Window) -> str:
        if at_end is None:
            return plugin_window(node, window)
        return with_restore(node, window, at_end)

    for name, make in ((PLUGIN_LOG, plugin), (KUBELET_LOG, kubelet_window)):
        try:
            content = make(node, window)
        except Exception as exc:  # evidence never decides a verdict
            rec.note(f"evidence {name} could not be read: {exc}")
            continue
        if content is not None:
            data = content.encode(errors="replace")
            rec.evidence(name, data[-MAX_BYTES:] if len(data) > MAX_BYTES else data)
