"""A check's plugin log survives a restore that replaces the plugin (hvconform.suite.evidence).

Where the evidence is cut by anchor (a pod's log, a container's), the restore may restart the
plugin: a CI run lost the log of a plugin that failed restart-kubelet because the restore
restarted its pod before the evidence was read. The log is now read when the check ends, and
the restore's lines follow it, said to be a new instance's when they are."""

from __future__ import annotations

from dataclasses import dataclass, field

from hvconform.suite import evidence


@dataclass
class PodLog:
    """A node whose plugin log is read by its tail only, as the cluster target's pod log."""

    lines: list[str] = field(default_factory=list)

    def plugin_log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.lines[-lines:])


def test_the_failing_instances_lines_are_kept_when_the_restore_replaces_it() -> None:
    node = PodLog([f"old {i}" for i in range(20)])
    window = evidence.open_window(node)
    node.lines += ["register_failed attempt=1", "register_failed attempt=2"]
    at_end = evidence.at_check_end(node, window)
    assert at_end is not None
    node.lines = ["new 0 started", "new 1 registered"]  # the restore restarted the pod
    text = evidence.with_restore(node, window, at_end)
    assert "register_failed attempt=2" in text
    assert "old 19" not in text, "lines from before the check are not its evidence"
    assert "the restore replaced the plugin" in text
    assert text.rstrip().endswith("new 1 registered")


def test_the_same_instance_continues_after_the_check_end() -> None:
    node = PodLog([f"old {i}" for i in range(20)])
    window = evidence.open_window(node)
    node.lines += ["fault seen", "repaired"]
    at_end = evidence.at_check_end(node, window)
    assert at_end is not None
    node.lines += ["restore: baseline"]
    text = evidence.with_restore(node, window, at_end)
    assert text.count("repaired") == 1, "a line is not repeated"
    assert "the plugin's log during the restore\nrestore: baseline" in text
    assert "replaced" not in text


@dataclass
class FileLog(PodLog):
    """A node with an exact byte offset into its own log file: nothing is read early."""

    def plugin_log_offset(self) -> int:
        return 0

    def plugin_log_since(self, offset: int, max_bytes: int) -> str:
        return "\n".join(self.lines)


def test_an_exact_cut_is_not_read_early() -> None:
    node = FileLog(["a"])
    assert evidence.at_check_end(node, evidence.open_window(node)) is None
