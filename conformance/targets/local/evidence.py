"""The local node's evidence hooks: its plugin log cut exactly by byte offset, and the kubelet
emulator's records of a check's window (hvconform.suite.evidence calls them when present).

The sandboxed plugin appends to one log file for the node's whole life (every restart of the
plugin opens it for appending), so the file's size when a check starts is exactly where that
check's lines begin. A node whose plugin runs elsewhere (the container runtime's node: its
engine keeps the running container's output) has no sandbox and says None, so the suite cuts its
log the generic way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hvconform.kubelet import ThreadedKubeletEmulator
    from hvconform.targets.host.sandbox import PluginSandbox


class LocalEvidence:
    sandbox: PluginSandbox | None
    kubelet: ThreadedKubeletEmulator | None

    def _own_log(self) -> Path | None:
        sandbox = getattr(self, "sandbox", None)
        return None if sandbox is None else Path(sandbox.log_path)

    def plugin_log_offset(self) -> int | None:
        """The plugin log's size now (where a check's lines begin); None: not a sandbox's log."""
        log = self._own_log()
        if log is None:
            return None
        try:
            return log.stat().st_size
        except FileNotFoundError:
            return 0

    def plugin_log_since(self, offset: int, max_bytes: int) -> str:
        """What the plugin wrote from `offset` on (at most the last max_bytes of it)."""
        log = self._own_log()
        if log is None or not log.exists():
            return ""
        with log.open("rb") as handle:
            size = handle.seek(0, 2)
            start = offset if offset <= size else 0  # a log started again: all of it is new
            start = max(start, size - max_bytes)
            handle.seek(start)
            return handle.read(size - start).decode(errors="replace")

    def kubelet_records_since(self, since: float) -> list[str]:
        """The emulator's timeline since `since` (monotonic), one line per record, the time in
        seconds after `since`: registrations, ListAndWatch lists, allocations, restarts."""
        if self.kubelet is None:
            return []
        return [
            f"{e.t - since:+.3f}s {e.kind.value} {e.resource} "
            + json.dumps(dict(e.detail), default=str, sort_keys=True)
            for e in self.kubelet.timeline(since=since)
        ]
