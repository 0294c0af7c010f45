"""Long cluster steps say that they started, that they still run, and how they ended."""

from __future__ import annotations

import threading

import pytest

from hvconform.targets.cluster import lifecycle


def test_a_long_step_beats_until_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "HEARTBEAT_S", 0.01)
    lines: list[str] = []
    beats = threading.Event()

    def out(text: str) -> None:
        lines.append(text)
        if text.startswith("still running"):
            beats.set()

    with lifecycle.progress("[setup] create-cluster", out):
        assert beats.wait(10), "no heartbeat while the step ran"
    assert lines[0] == "started"
    assert lines[-1].startswith("done in ")
    count = len(lines)
    assert beats.is_set() and count >= 3
    # The ticker is gone once the step ended: nothing more is said.
    assert not any(t.name.startswith("progress ") for t in threading.enumerate())
    assert len(lines) == count


def test_a_failed_step_says_so() -> None:
    lines: list[str] = []
    with pytest.raises(RuntimeError), lifecycle.progress("[cleanup] delete", lines.append):
        raise RuntimeError("boom")
    assert lines[0] == "started" and lines[-1].startswith("failed after ")
